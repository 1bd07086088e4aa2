"""The Plan: one frozen object holding every knob of a training configuration."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from trainwise.common.errors import InputError
from trainwise.common.suggest import closest
from trainwise.plan.knobs import KnobSpec, knob, knob_specs

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "bf16-pure")
OPTIMIZERS = ("adamw", "adamw-fused", "adafactor", "adamw-8bit", "sgd")
ATTENTIONS = ("eager", "sdpa", "flash", "auto")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
LOSSES = ("default", "fused")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
COMPILE_SCOPES = ("blocks", "model")
LR_SCHEDULES = ("cosine", "linear", "constant")
CLASSIC_LAYOUTS = ("none", "data-parallel", "vertical")
KERNELS = ("none", "liger")
PACKINGS = ("stream", "documents")
GRAD_CKPT_POLICIES = ("full", "selective")


@dataclass(frozen=True)
class Plan:
    """Every knob of one training configuration. Sizes are per device unless said otherwise."""

    # --- batch shape
    batch_size: int = knob(4, "micro-batch size per device (samples)", minimum=1, group="batch shape")
    grad_accum: int = knob(1, "micro-batches accumulated per optimizer step", minimum=1, group="batch shape")
    seq_len: int = knob(512, "tokens per sample", minimum=1, group="batch shape")
    packing: str = knob("stream", "how text fills a row: stream (documents joined by the end-of-document id; "
                                  "attention crosses them) or documents (position ids restart at each document, "
                                  "attention and the loss stay inside it)", choices=PACKINGS, group="batch shape")
    # --- numerics and optimizer
    precision: str = knob("fp32", "numeric precision of the step", choices=PRECISIONS, group="precision and memory")
    optim: str = knob("adamw", "optimizer", choices=OPTIMIZERS, group="optimizer")
    lr: float = knob(3e-4, "peak learning rate", minimum=0.0, group="optimizer")
    weight_decay: float = knob(0.01, "decoupled weight decay (not applied to biases and norms)", minimum=0.0, group="optimizer")
    warmup_steps: int = knob(0, "linear warm-up steps", minimum=0, group="optimizer")
    lr_schedule: str = knob("cosine", "learning-rate schedule after warm-up", choices=LR_SCHEDULES, group="optimizer")
    max_grad_norm: float = knob(1.0, "gradient clipping norm (0 disables)", minimum=0.0, group="optimizer")
    # --- memory and speed techniques
    grad_ckpt: bool = knob(False, "gradient (activation) checkpointing per transformer block", group="precision and memory")
    activation_offload: bool = knob(False, "move the tensors the transformer blocks save for backward to pinned host "
                                           "memory in forward, back in backward (CUDA; refused on cpu, where nothing would move)", group="precision and memory")
    grad_ckpt_policy: str = knob("full", "with --grad-ckpt: full recomputes a checkpointed block's whole forward; "
                                         "selective keeps its matmul and attention outputs and recomputes the rest",
                                 choices=GRAD_CKPT_POLICIES, group="precision and memory")
    grad_ckpt_every: int = knob(1, "with --grad-ckpt: checkpoint every K-th block (0, K, 2K, ...); the others keep "
                                   "their activations", minimum=1, group="precision and memory")
    attention: str = knob("sdpa", "attention kernel; auto picks flash where it runs, else sdpa, else eager, "
                                          "and says which", choices=ATTENTIONS, group="kernels and compile")
    loss: str = knob("default", "causal-lm loss: default (the model's own) or fused (the LM head and cross-entropy "
                                "in chunks of tokens, never holding the full tokens x vocabulary logits)",
                     choices=LOSSES, group="kernels and compile")
    compile: bool = knob(False, "torch.compile the model (see --compile-scope); the compiled code is cached per user", group="kernels and compile")
    compile_mode: str = knob("default", "torch.compile mode", choices=COMPILE_MODES, group="kernels and compile")
    compile_scope: str = knob("blocks", "with --compile: each transformer block (shared code, fast first step; the "
                                        "rest stays eager) or the whole model", choices=COMPILE_SCOPES, group="kernels and compile")
    kernels: str = knob("none", "fused kernels patched into the model at run time: liger (Liger-Kernel's RMSNorm, "
                                "RoPE, SwiGLU/GeGLU and fused linear cross-entropy; Llama, Mistral, Qwen2/3 and "
                                "Gemma families; CUDA)", choices=KERNELS, group="kernels and compile")
    float8: bool = knob(False, "float8 matmuls in the linear layers (torchao float8 training; compute capability "
                               "8.9+, with --compile; changes the training math)", group="kernels and compile")
    lora_rank: int = knob(0, "LoRA rank (0 trains all weights)", minimum=0, group="precision and memory")
    lora_alpha: int = knob(16, "LoRA scaling alpha", minimum=1, group="precision and memory")
    lora_targets: str = knob("auto", "comma-separated module names for LoRA, or auto (peft's default for the model)", group="precision and memory")
    # --- data loading
    workers: int = knob(0, "DataLoader worker processes", minimum=0, group="data")
    pin_memory: bool = knob(False, "pin host memory for faster host-to-device copies", group="data")
    # --- where
    device: str = knob("cuda", "cpu, cuda (the GPU present), or a GPU name from the hardware catalog", group="parallel layout")
    # --- parallel layout
    nproc: int = knob(1, "processes (GPUs) on this node", minimum=1, group="parallel layout")
    dp: int = knob(1, "data-parallel replicas (DDP)", minimum=1, group="parallel layout")
    fsdp: int = knob(1, "sharded data-parallel degree (FSDP2)", minimum=1, group="parallel layout")
    zero: int | None = knob(None, "ZeRO stage for sharded data parallel", choices=("1", "2", "3"), optional=True, kind=int, group="parallel layout")
    cpu_offload: bool = knob(False, "offload sharded parameters and optimizer state to CPU", group="parallel layout")
    tp: int = knob(1, "tensor-parallel degree", minimum=1, group="parallel layout")
    sequence_parallel: bool = knob(False, "with --tp: norms and the residual stream sharded over the sequence "
                                          "(sequence parallel; their activations divided by tp)", group="parallel layout")
    pp: int = knob(1, "pipeline-parallel stages", minimum=1, group="parallel layout")
    pp_schedule: str = knob("1f1b", "pipeline schedule", choices=PP_SCHEDULES, group="parallel layout")
    microbatches: int | None = knob(None, "pipeline micro-batches per step (default: 2 x pp)", minimum=1, optional=True, kind=int, group="parallel layout")
    classic: str = knob("none", "one-process classic layouts over the visible GPUs, for comparison: data-parallel "
                                "(torch.nn.DataParallel) or vertical (blocks placed on the GPUs in order)",
                        choices=CLASSIC_LAYOUTS, group="parallel layout")

    # ------------------------------------------------------------------ derived
    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def global_batch_per_device(self) -> int:
        """Samples per optimizer step on one data-parallel rank."""
        return self.batch_size * self.grad_accum

    @property
    def is_distributed(self) -> bool:
        return any(d > 1 for d in (self.nproc, self.dp, self.fsdp, self.tp, self.pp)) or self.zero is not None

    # ------------------------------------------------------------------ io
    @classmethod
    def specs(cls) -> tuple[KnobSpec, ...]:
        return knob_specs(cls)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "plan") -> "Plan":
        """Build a validated Plan from loosely typed values (a file, CLI strings)."""
        return cls(**validated_values(cls.specs(), values, source, "knob"))

    def to_dict(self) -> dict[str, Any]:
        # Every knob is a scalar (tests/test_plan.py), so reading the fields is a full copy;
        # dataclasses.asdict deep-copies each, and a search reads thousands of plans' knobs.
        return {name: getattr(self, name) for name in _field_names()}

    def replace(self, **changes) -> "Plan":
        return Plan.from_dict({**self.to_dict(), **changes})

    def changed_knobs(self) -> dict[str, Any]:
        """Knobs that differ from their defaults, for compact display."""
        return {s.name: getattr(self, s.name) for s in self.specs() if getattr(self, s.name) != s.default}


@functools.cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Plan))


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def validated_values(specs, values: dict[str, Any], source: str, noun: str) -> dict[str, Any]:
    """`values` keyed by field name (dashes allowed) and converted by `coerce`; an unknown
    key is an InputError listing the known ones."""
    by_name = {s.name: s for s in specs}
    clean = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in by_name:
            raise InputError(f"{source}: {key}", f"unknown {noun}; known {noun}s: {', '.join(sorted(by_name))}")
        clean[name] = coerce(by_name[name], value)
    return clean


def coerce(spec: KnobSpec, value: Any) -> Any:
    """Convert `value` to the knob's type and check it is allowed; raise InputError naming the flag."""
    if value is None:
        if spec.optional:
            return None
        raise InputError(spec.flag, f"must be {spec.allowed()} (got nothing)")
    try:
        if spec.kind is bool:
            if isinstance(value, bool):
                converted = value
            elif str(value).lower() in _TRUE | _FALSE:
                converted = str(value).lower() in _TRUE
            else:
                raise ValueError
        elif spec.kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            converted = int(value)
        elif spec.kind is float:
            if isinstance(value, bool):
                raise ValueError
            converted = float(value)
        else:
            converted = str(value)
    except (TypeError, ValueError):
        raise InputError(spec.flag, f"must be {spec.allowed()} (got {value!r})") from None
    if spec.choices and str(converted) not in spec.choices:
        guess = closest(str(converted), spec.choices)
        hint = f"; did you mean {guess}?" if guess else ""
        raise InputError(spec.flag, f"must be {spec.allowed()} (got {value!r}){hint}")
    if spec.minimum is not None and converted < spec.minimum:
        raise InputError(spec.flag, f"must be {spec.allowed()} (got {value!r})")
    return converted
