"""Blocks that differ by design: the kind of each layer of a stack, read from its config.

Some models repeat a pattern of unlike blocks rather than one block: Gemma 2 alternates
sliding-window and full attention, Gemma 3 has five sliding layers to one full one,
ModernBERT attends globally every `global_attn_every_n_layers` layers, hybrid and
interleaved mixture-of-experts decoders mix mixer or feed-forward kinds. transformers builds
each layer from per-layer config fields, which are read here the same way:

* `layer_types` (one entry a layer: "full_attention", "sliding_attention", a linear or
  state-space mixer...). Gemma 2/3 and ModernBERT derive it from `sliding_window_pattern` /
  `global_attn_every_n_layers` when the config is made, so it is the one field to read;
* `mlp_layer_types` ("dense" / "sparse" a layer);
* Qwen2/Qwen3-MoE's rule: a layer is sparse when it is not in `mlp_only_layers`, the model
  has experts and (index + 1) is a multiple of `decoder_sparse_step`;
* DeepSeek/GLM-MoE's `first_k_dense_replace`: the first k layers are dense.

A layer's kind joins the parts that apply ("sliding_attention+sparse"); a stack whose
layers are all of one kind is uniform, and is extrapolated as before
(trainwise/trace/depth.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: reading a depth or a spec needs no transformers import
    from transformers import PretrainedConfig

UNIFORM_KIND = "block"


@dataclass(frozen=True)
class LayerPattern:
    """The kind of each layer of the full-depth stack, in order."""

    kinds: tuple[str, ...]

    @property
    def distinct(self) -> tuple[str, ...]:
        """The kinds in order of first appearance."""
        return tuple(dict.fromkeys(self.kinds))

    @property
    def uniform(self) -> bool:
        return len(self.distinct) <= 1

    @property
    def period(self) -> int:
        """The shortest p with kinds[i] == kinds[i + p] for every i (Gemma 3: 6; Gemma 2: 2;
        ModernBERT: global_attn_every_n_layers; the whole depth when nothing repeats)."""
        n = len(self.kinds)
        return next((p for p in range(1, n) if self.kinds[p:] == self.kinds[:n - p]), max(n, 1))

    def counts(self, depth: int) -> tuple[int, ...]:
        """How many of the first `depth` layers are of each distinct kind (a config cut to
        `depth` layers keeps the first ones: trainwise/trace/depth.py `with_blocks`)."""
        seen = Counter(self.kinds[:depth])
        return tuple(seen[kind] for kind in self.distinct)


def layer_pattern(config: PretrainedConfig, layers: int, checkpoint_every: int = 1) -> LayerPattern:
    """The kinds of a stack of `layers` layers built from `config`; with `checkpoint_every`
    k > 1 (--grad-ckpt-every), blocks 0, k, 2k, ... are checkpointed and the others are not,
    which makes them differ in memory and work as much as by design."""
    parts = [_per_layer_list(config, "layer_types", layers), _mlp_kinds(config, layers),
             ["checkpointed" if i % checkpoint_every == 0 else "kept" for i in range(layers)]]
    parts = [part for part in parts if part is not None and len(set(part)) > 1]
    if not parts:
        return LayerPattern((UNIFORM_KIND,) * layers)
    return LayerPattern(tuple("+".join(kinds) for kinds in zip(*parts)))


def _per_layer_list(config: PretrainedConfig, name: str, layers: int) -> list[str] | None:
    value = getattr(config, name, None)
    if isinstance(value, (list, tuple)) and len(value) == layers:
        return [str(kind) for kind in value]
    return None


def _mlp_kinds(config: PretrainedConfig, layers: int) -> list[str] | None:
    """"dense" or "sparse" per layer, by the rule the model's code applies; None if none does."""
    listed = _per_layer_list(config, "mlp_layer_types", layers)
    if listed is not None:
        return listed
    step = getattr(config, "decoder_sparse_step", None)
    if isinstance(step, int) and step > 0:
        dense_only = set(getattr(config, "mlp_only_layers", None) or ())
        experts = (getattr(config, "num_experts", 0) or 0) > 0
        return ["sparse" if experts and i not in dense_only and (i + 1) % step == 0 else "dense"
                for i in range(layers)]
    first_dense = getattr(config, "first_k_dense_replace", None)
    if isinstance(first_dense, int) and first_dense > 0:
        return ["dense" if i < first_dense else "sparse" for i in range(layers)]
    return None
