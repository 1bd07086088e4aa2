"""A package's names imported on first use (PEP 562), so importing one light module of the
package does not import its heavy neighbours (torch, transformers): a cached estimate reads
the model catalog and the plan without either."""

from __future__ import annotations

import importlib


def lazy_attributes(package: str, table: dict[str, tuple[str, str]]):
    """The module `__getattr__` of `package` that imports `table[name]` = (module, attribute)
    when `name` is first read."""
    def __getattr__(name):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = table[name]
        return getattr(importlib.import_module(module), attribute)
    return __getattr__
