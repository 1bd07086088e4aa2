"""Make transformers take the code path of a real training step while we trace.

transformers treats a FakeTensor as a sign of graph tracing (torch.export, compile) and
then never skips work whose skipping depends on tensor values: it materialises a 4-D
attention mask even when every token is attended, which a real step skips (and with
grouped-query attention it then also repeats K and V). Our fake step is a real eager
step in every other respect, so within the trace we tell transformers a fake tensor is
not a tracing proxy. The value-dependent questions it then asks ("is the mask all ones?",
"are the positions one unpacked sequence?") are answered by the recorder the way a real
synthetic batch answers them (see recorder.py `bool_read_answer`)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def fake_tensors_are_not_tracing():
    try:
        from transformers.utils import import_utils
    except ImportError:
        yield
        return
    original = getattr(import_utils, "is_fake_tensor", None)
    if original is None:
        yield
        return
    # is_tracing() looks the helper up in its module's globals at each call, so one patch
    # covers every transformers module that imported is_tracing by name.
    import_utils.is_fake_tensor = lambda tensor: False
    try:
        yield
    finally:
        import_utils.is_fake_tensor = original
