"""Which module is running: a stack maintained by global forward hooks."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook


class ModuleScope:
    """Context manager exposing `current`, the qualified name of the innermost running module
    of `model` ("" outside it). Recomputation under checkpointing re-enters forward, so the
    names stay right in backward too."""

    def __init__(self, model: nn.Module):
        # The root module's name is "", which reads badly: call it by its class.
        self._names = {id(m): name or type(m).__name__ for name, m in model.named_modules()}
        self._stack: list[str] = []
        self._handles = []

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else ""

    def _push(self, module, *_):
        name = self._names.get(id(module))
        if name is not None:
            self._stack.append(name)

    def _pop(self, module, *_):
        if id(module) in self._names and self._stack:
            self._stack.pop()

    def __enter__(self):
        self._handles = [register_module_forward_pre_hook(self._push), register_module_forward_hook(self._pop)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._stack.clear()
