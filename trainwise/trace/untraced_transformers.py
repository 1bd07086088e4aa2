"""Make transformers take the code path of a real training step while we trace.

transformers treats a FakeTensor as a sign of graph tracing (torch.export, compile) and
then never skips work whose skipping depends on tensor values: it materialises a 4-D
attention mask even when every token is attended, which a real step skips (and with
grouped-query attention it then also repeats K and V). Our fake step is a real eager
step in every other respect, so within the trace we tell transformers a fake tensor is
not a tracing proxy. The value-dependent questions it then asks ("is the mask all ones?",
"are the positions one unpacked sequence?") are answered by the recorder the way a real
synthetic batch answers them (see plain_batch.py)."""

from __future__ import annotations

import contextlib

import torch


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


@contextlib.contextmanager
def documents_in_every_row(active: bool):
    """With `--packing documents` (`active`) a real batch's rows hold several documents,
    so transformers' question "is each row one sequence?" (find_packed_sequence_indices)
    is answered no, and the trace builds the document mask the real step builds. (A real
    batch whose every row is one document skips that mask: the estimate is then high by
    it.) Answered here because the recorder answers every "all ...?" yes."""
    if not active:
        yield
        return
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices

    def document_index(position_ids):
        # Each position that does not continue its left neighbour by one opens a document.
        before_first = position_ids[:, :1] - 1
        return (torch.diff(position_ids, prepend=before_first, dim=-1) != 1).cumsum(-1)

    masking_utils.find_packed_sequence_indices = document_index
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original
