"""The work of every op of a traced step, added up by kind: what the step-time model reads.

While the memory trace runs (trainwise/trace/recorder.py), every aten op it sees is added
to one row of the step's op table (trainwise/trace/op_table.py: `OpCosts`) keyed by (phase,
micro-step, op class, dtype name, recomputed?, head dim) holding (ops, FLOPs, bytes read,
bytes written); the head dim is the last dimension of an attention kernel's query, 0 for
every other op.

Op classes (decided here, documented in docs/plan.md):
* "matmul": matrix products and convolutions (mm, bmm, addmm, baddbmm, convolution and its
  backward, fp8 scaled mm, grouped mm), FLOPs from PyTorch's formulas;
* "attention": the fused scaled-dot-product kernels and their backward (flash, efficient,
  cuDNN, the CPU's flash kernel). FLOPs are kernel work: backward counts the score matrix
  the kernels recompute (2.5x the forward), unlike the model FLOPs of MFU (flops.py). Their
  rows keep the head dim: a kernel's FLOPs grow with it and its softmax over the scores
  does not, so a CPU runs small heads at a fraction of the rate of large ones;
* "normalization": layer-norm, RMS-norm, group- and batch-norm kernels and their backward,
  and element-wise ops run inside a module whose class is a norm (Llama's RMSNorm is
  written as element-wise ops). Autograd gives no module in backward, so the backward of
  such a norm counts as "elementwise";
* "transcendental": element-wise ops that evaluate exp, log, tanh, erf or a sine per element
  (softmax and log-softmax and their backward, SiLU, GELU, sigmoid, ...): memory-bound on a
  GPU, but on a CPU core the arithmetic of each element costs more than moving it, so a
  profile may give them their own rate (bytes read and written, as "elementwise");
* "random": ops that draw random numbers (dropout's mask: `bernoulli_`, `native_dropout`;
  `rand`, `randn`, `uniform_`, `normal_`, ...): on a CPU core generating each number costs
  far more than moving it (a `bernoulli_` mask ~40x an fp32 add per element, one thread),
  so a profile gives them their own rate (bytes read and written, as "elementwise");
* "metadata": views, aliases, `empty` and the like: they go through the dispatcher (host
  time) but launch no kernel and move no bytes;
* "elementwise": every other op, memory-bound, costed by the bytes it reads and writes.

A custom op of the Liger stand-in (trainwise/techniques/liger_stand_in_ops.py) is one fused
kernel: one op reading its inputs and writing its outputs and the tensors it overwrites
once, classed by what it computes (RMSNorm: "normalization"; the gated activations:
"transcendental"; the rotary embedding: "elementwise").

Bytes are the sizes of the tensors an op reads and writes as it sees them (a view counts
its own elements, not its whole storage). Ops run in backward while grad mode is on are
the forward that activation checkpointing recomputes, when they run inside a module:
autograd runs backward formulas with grad mode off, and checkpointing turns it on to
rebuild the graph (tests/test_step_time.py checks both on fake tensors); outside any
module, `backward()` itself makes the first gradient (ones) with grad mode on."""

from __future__ import annotations

import functools

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper

from trainwise.trace.flops_formulas import flash_layout, model_flop_formulas
from trainwise.trace.fusion import CompiledRegions, FusionGrouper
from trainwise.trace.op_table import OpCosts

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPE_NAMES[getattr(torch, _name)] = "fp8"
NORM_OPS = ("native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
            "native_group_norm", "native_group_norm_backward", "native_batch_norm", "native_batch_norm_backward",
            "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
            "liger_rms_norm", "liger_rms_norm_backward")  # the Liger stand-in's (techniques/liger_stand_in_ops.py)
ATTENTION_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention_for_cpu_backward",
                 "_flash_attention_forward", "_flash_attention_backward",
                 "_efficient_attention_forward", "_efficient_attention_backward")
MATMUL_OPS = ("mm", "bmm", "addmm", "baddbmm", "_scaled_mm", "convolution", "_convolution", "convolution_backward",
              "cudnn_convolution", "convolution_overrideable", "_slow_conv2d_forward", "_grouped_mm")
# Element-wise ops whose per-element work is a transcendental function (their backward too
# where it evaluates one again); cheap backward formulas (tanh's 1 - y^2) stay "elementwise".
TRANSCENDENTAL_OPS = ("exp", "exp_", "exp2", "expm1", "log", "log_", "log1p", "log2", "log10", "logsumexp",
                      "_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
                      "_safe_softmax", "tanh", "tanh_", "sigmoid", "sigmoid_", "silu", "silu_", "silu_backward",
                      "gelu", "gelu_", "gelu_backward", "erf", "erf_", "erfinv", "sin", "cos", "softplus",
                      "softplus_backward", "mish", "mish_backward", "elu", "elu_backward",
                      "liger_gated_activation", "liger_gated_activation_backward")
# Ops that draw random numbers (a generator's arithmetic per element); the synthetic
# batch's `randint` runs in the data phase, which the CPU model does not time.
RANDOM_OPS = ("bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like", "randn", "randn_like", "randint",
              "randint_like", "random_", "uniform_", "normal", "normal_", "exponential_", "geometric_",
              "log_normal_", "cauchy_", "multinomial", "randperm", "poisson")
# Ops with no kernel. Views are recognised from their schema (an output aliasing an input);
# `_unsafe_view` is a view whose schema does not say so.
NO_KERNEL_OPS = ("_unsafe_view", "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach",
                 "alias", "lift_fresh", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset")


class OpCostRecorder:
    """Adds each op the AllocationRecorder dispatches to an OpCosts. `norm_modules` are the
    qualified names of the model's normalisation modules; `micro_step` is set by the step.

    `costs` prices every op as eager. With `regions` (compiled regions) the same ops are
    also priced as the compiled step runs them, in `compiled_costs`: the ops inside the
    regions grouped as inductor fuses them, following storages by `key_of`
    (trainwise/trace/fusion.py), the others as eager. Compile changes what the ops cost,
    not which ops run, so one trace gives both."""

    def __init__(self, model: torch.nn.Module, regions: CompiledRegions | None = None, key_of=None):
        self.costs = OpCosts()
        self.micro_step = 0
        self.norm_modules = {name or type(m).__name__ for name, m in model.named_modules()
                             if "norm" in type(m).__name__.lower()}
        self.regions = regions
        self.compiled_costs = OpCosts() if regions is not None else None
        self.fusion = FusionGrouper(self.compiled_costs.compiled, key_of) if regions is not None else None

    def record(self, func, args, kwargs, out, outputs: list[torch.Tensor], phase: str, module: str) -> None:
        op_class = classify(func)
        inputs = [_payload(t) for t in op_tensors(args, kwargs)]
        if op_class == "elementwise" and module in self.norm_modules:
            op_class = "normalization"
        flops = read = written = head_dim = 0
        if op_class == "attention":
            head_dim = attention_head_dim(func, args, kwargs)
        if op_class != "metadata":
            read = sum(_nbytes(t) for t in inputs)
            written = sum(_nbytes(t) for t in outputs) + _written_in_place(func, args)
            if op_class in ("matmul", "attention"):
                flops = kernel_flops(func, args, kwargs or {}, out)
        # In a module's forward: backward() makes its first gradient with grad mode on too.
        recomputed = phase == "backward" and module != "" and torch.is_grad_enabled()
        micro = self.micro_step if phase in ("data", "forward", "backward") else 0
        key = (phase, micro, op_class, _dtype_name(inputs or outputs), recomputed, head_dim)
        _add_op(self.costs.rows, key, flops, read, written)
        if self.fusion is not None and not self.fusion.op(self.regions.region(phase, module), key, op_class, inputs,
                                                          [_payload(t) for t in outputs], [1, flops, read, written]):
            _add_op(self.compiled_costs.rows, key, flops, read, written)  # run eager in the compiled step too

    def record_query(self, tensor, phase: str, module: str) -> None:
        """`record` of `tensor.device` (prim.device, a metadata op): most ops of a step are
        these (autograd asks for every gradient's device), so the row is made directly, as
        `record` makes it for an op of one argument, no output and no work."""
        inputs = [_payload(tensor)] if isinstance(tensor, torch.Tensor) else []
        recomputed = phase == "backward" and module != "" and torch.is_grad_enabled()
        micro = self.micro_step if phase in ("data", "forward", "backward") else 0
        key = (phase, micro, "metadata", _dtype_name(inputs), recomputed, 0)
        _add_op(self.costs.rows, key, 0, 0, 0)
        if self.fusion is not None and not self.fusion.op(self.regions.region(phase, module), key, "metadata", inputs,
                                                          [], [1, 0, 0, 0]):
            _add_op(self.compiled_costs.rows, key, 0, 0, 0)

    def saved(self, key: int | None) -> None:
        """Autograd keeps storage `key` for backward (a compiled region writes it out)."""
        if self.fusion is not None:
            self.fusion.saved(key)


def _add_op(rows: dict, key: tuple, flops: int, read: int, written: int) -> None:
    row = rows.get(key)
    if row is None:
        rows[key] = [1, flops, read, written]
    else:
        row[0] += 1
        row[1] += flops
        row[2] += read
        row[3] += written


def _written_in_place(func, args: tuple) -> int:
    """Bytes a trainwise custom op (one fused kernel of a stand-in) writes into the tensors
    it mutates: its schema declares them and it returns nothing for them, unlike aten's
    in-place ops, whose outputs are the mutated tensors and already counted."""
    if func.namespace != "trainwise":
        return 0
    return sum(_nbytes(value) for value, argument in zip(args, func._schema.arguments)
               if isinstance(value, torch.Tensor) and argument.alias_info is not None and argument.alias_info.is_write)


def op_tensors(args: tuple, kwargs: dict | None) -> list[torch.Tensor]:
    """The tensors among an op's arguments, one level of lists deep (foreach ops): aten
    schemas nest no deeper, and this runs for every op (pytree's flattening is slower)."""
    found = []
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _payload(tensor: torch.Tensor) -> torch.Tensor:
    """What an op reads from `tensor`: a wrapper subclass keeping its data in `_data`
    (torchao's float8 training tensor: float8 bytes behind a bf16 dtype) reads that, so
    its matmul is priced at the float8 rate on 1-byte operands."""
    if type(tensor) is FakeTensor:
        return tensor
    data = getattr(tensor, "_data", None)
    return data if isinstance(data, torch.Tensor) else tensor


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _dtype_name(tensors: list[torch.Tensor]) -> str:
    """The dtype an op computes in: its first floating-point tensor's, else its first's."""
    for tensor in tensors:
        if tensor.dtype.is_floating_point:
            return _short_name(tensor.dtype)
    return _short_name(tensors[0].dtype) if tensors else "none"


@functools.cache
def _short_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


@functools.cache
def classify(func) -> str:
    """The op class of an aten (or custom) op overload; see the module docstring."""
    name = func.overloadpacket.__name__
    if name in MATMUL_OPS or func.overloadpacket in _grouped_formulas():
        return "matmul"
    if name in ATTENTION_OPS:
        return "attention"
    if name in NORM_OPS:
        return "normalization"
    if name in TRANSCENDENTAL_OPS:
        return "transcendental"
    if name in RANDOM_OPS:
        return "random"
    if name in NO_KERNEL_OPS or func.namespace == "prim" or _is_view(func):
        return "metadata"
    return "elementwise"


def attention_head_dim(func, args: tuple, kwargs: dict | None) -> int:
    """The head dim of an attention kernel: the last dimension of its `query` argument
    (every fused attention op, forward and backward, names it so; batch-first or
    heads-first, the head dim is last); 0 when it has none."""
    index = _query_index(func)
    query = args[index] if index is not None and index < len(args) else (kwargs or {}).get("query")
    return int(query.shape[-1]) if isinstance(query, torch.Tensor) and query.dim() else 0


@functools.cache
def _query_index(func) -> int | None:
    names = [argument.name for argument in func._schema.arguments]
    return names.index("query") if "query" in names else None


def _is_view(func) -> bool:
    """An op whose output aliases an input without writing it (view, reshape of a
    contiguous tensor, transpose, expand, ...); in-place ops alias too but write."""
    schema = func._schema
    returns_alias = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    return returns_alias and not schema.is_mutable


def kernel_flops(func, args, kwargs: dict, out) -> int:
    """FLOPs of one matmul or attention kernel (a multiply-add is 2); 0 without a formula."""
    formula = _kernel_formulas().get(func.overloadpacket)
    return int(formula(*args, out_val=out, **kwargs)) if formula is not None else 0


def _cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, _as_query_heads(key, query), _as_query_heads(value, query))


def _cpu_attention_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, _as_query_heads(key, query), _as_query_heads(value, query))


def _flash_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """PyTorch's FlashAttention-2 op, in its (batch, seq, heads, head_dim) layout (PyTorch's own
    formula reads it as SDPA's: flops_formulas.py)."""
    return _cpu_attention_forward(flash_layout(query), flash_layout(key), flash_layout(value))


def _flash_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return _cpu_attention_backward(flash_layout(grad_out), flash_layout(query), flash_layout(key),
                                   flash_layout(value))


def _as_query_heads(shape, query_shape) -> tuple:
    """A key or value shape (batch, heads, seq, dim) with the query's head count: grouped-query
    attention broadcasts K/V heads to the query's, so the kernel's work is that of equal heads.
    PyTorch's formula accepts grouped heads only from 2.13 on (2.11 raises on them)."""
    return (shape[0], query_shape[1], *shape[2:])


@functools.cache
def _grouped_formulas() -> dict:
    """Mixture-of-experts grouped matmuls (flops_formulas.py): the ops that are not attention."""
    return {op: f for op, f in model_flop_formulas().items() if "attention" not in op.__name__}


@functools.cache
def _kernel_formulas() -> dict:
    """PyTorch's formulas (kernel work), the CPU flash kernel's (the same work as CUDA's),
    the FlashAttention-2 op's in its own layout, and the grouped matmuls'. Shape formulas are wrapped as FlopCounterMode does."""
    aten = torch.ops.aten
    formulas = dict(flop_registry)
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu] = shape_wrapper(_cpu_attention_forward)
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = shape_wrapper(_cpu_attention_backward)
    if hasattr(aten, "_flash_attention_forward"):
        formulas[aten._flash_attention_forward] = shape_wrapper(_flash_forward)
        formulas[aten._flash_attention_backward] = shape_wrapper(_flash_backward)
    for op, formula in _grouped_formulas().items():
        formulas[op] = formula if getattr(formula, "_get_raw", False) else shape_wrapper(formula)
    return formulas
