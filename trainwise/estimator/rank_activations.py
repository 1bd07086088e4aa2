"""Corrections to the traced one-device activations of a rank's workload: what a pipeline
stage does not hold (stage_activations), what sequence parallel divides by tp
(sequence_parallel_saving) and the tensor the vocab-parallel loss keeps beyond the plain
cross-entropy (loss_parallel_extra). Module names come from the model family
(trainwise/models/families/)."""

from __future__ import annotations

import re

from trainwise.estimator.rank_view import RankModel, RankView
from trainwise.models.families import family_of
from trainwise.plan.layout import Layout
from trainwise.plan.plan import Plan


def stage_activations(traced: int, by_module: dict[str, int], view: RankView, config) -> int:
    """Saved activations of the rank's stages: the traced chunk's, less what the embeddings
    or the head (final norm, logits, loss) saved where the rank holds none, times the
    chunks in flight."""
    if view.has_embedding and view.has_head:
        return traced * view.chunks_in_flight
    parts = family_of(config).pipeline
    core = parts.blocks.split(".")[0] + "."

    def is_head(module: str) -> bool:  # the loss runs outside the core model
        return parts.holds(module, parts.last) or not (module.startswith(core) or module == "(model inputs)")

    dropped = sum(nbytes for module, nbytes in by_module.items()
                  if (not view.has_head and is_head(module))
                  or (not view.has_embedding and parts.holds(module, parts.first)))
    return max(traced - dropped, 0) * view.chunks_in_flight


def sequence_parallel_saving(by_module: dict[str, int], model: RankModel, plan: Plan, layout: Layout,
                             policy, view: RankView | None = None) -> int:
    """Saved activations sequence parallel divides by tp: what each block's norms saved and
    what the block, or the module owning a norm, saved outside its sub-modules (the
    residual sums the next norm keeps),
    and the final norm's, less each norm's output where it is saved whole all the same
    (without autocast the projections after it keep their gathered input; under autocast
    they keep their own low-precision casts, attributed to them, and the output itself is
    not saved). Measured from the traced blocks' middle one, times the rank's blocks; on a
    pipeline rank (`view`) times its chunks in flight, the final norm only where it holds
    the head."""
    family = family_of(model.config)
    if not layout.sequence_parallel or family is None or family.sequence_parallel is None:
        return 0
    found = _block_prefix(by_module, family.blocks)
    if found is None:
        return 0
    owner, indices = found
    block = f"{owner}{family.blocks}.{indices[len(indices) // 2]}"
    norms = family.sequence_parallel.norms
    rows = layout.chunk_batch if layout.pp > 1 else plan.batch_size  # the traced step: one pipeline chunk
    whole = (rows * plan.seq_len * model.config.hidden_size * policy.param_dtype.itemsize
             if policy.autocast_dtype is None else 0)
    # The residual sums are made in the module owning each norm: the block (pre-norm
    # Llama, GPT-2) or, in BERT's post-norm blocks, the output sub-modules around them.
    owners = {norm.rpartition(".")[0] for norm in norms}
    per_block = sum(nbytes for module, nbytes in by_module.items()
                    if module == block or module.removeprefix(block + ".") in (*norms, *owners)) - len(norms) * whole
    final_norm = family.sequence_parallel.final_norm
    has_head = view is None or view.has_head
    final = by_module.get(owner + final_norm, 0) - whole if final_norm is not None and has_head else 0
    in_flight = 1 if view is None else view.chunks_in_flight
    return max(round((per_block * model.config.num_hidden_layers + final) * in_flight * (1 - 1 / layout.tp)), 0)


def _block_prefix(by_module: dict[str, int], blocks: str) -> tuple[str, list[int]] | None:
    """(the path of the module owning the blocks, with its dot; the traced block indices):
    the blocks sit under the traced model's root (Llama's causal LM) or under a core model
    a head wraps (GPT-2's `transformer.`, BERT's `bert.`). None where no block was traced."""
    pattern = re.compile(rf"^(.*?){re.escape(blocks)}\.(\d+)(\.|$)")
    matches = [match for match in map(pattern.match, by_module)
               if match is not None and (match.group(1) == "" or match.group(1).endswith("."))]
    if not matches:
        return None
    owner = matches[0].group(1)
    return owner, sorted({int(match.group(2)) for match in matches if match.group(1) == owner})


def loss_parallel_extra(model: RankModel, plan: Plan, layout: Layout, view: RankView) -> int:
    """The vocab-parallel cross-entropy (DTensor's loss_parallel, on the rank holding the
    causal-LM head) keeps one more fp32 tensor of the local logits' size than the plain
    cross-entropy the one-device trace runs. Found by measuring rank 0 of tiny-llama on
    gloo against the local-shape model at two vocabularies; without it the estimate read
    11 % low there. tests/test_parallel_engine.py ("TP 2", "TP 2, vocabulary 4096")
    checks the peak with it."""
    if layout.tp == 1 or not view.has_head or model.task != "causal-lm" or model.config is None:
        return 0
    family = family_of(model.config)
    if family is None or not family.vocab_parallel_head:
        return 0
    chunk = layout.chunk_batch
    return chunk * plan.seq_len * model.config.vocab_size * 4  # model.config: already the rank's vocabulary
