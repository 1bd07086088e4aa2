"""Autocast as the target device applies it, while the trace itself runs on CPU.

The tracer runs the step on fake CPU tensors (a CPU-only torch cannot run autograd on fake
CUDA tensors), so mixed precision there means CPU autocast. CUDA autocast casts a different
set of ops: softmax, layer_norm, exp, pow, sum... run in float32 on CUDA but stay in the
input dtype on CPU, while CPU casts ops that CUDA leaves alone (cat, cross_entropy_loss,
fft, linalg...). The dtypes of the tensors saved for backward follow those casts, so for a
CUDA target the trace must follow CUDA's policy.

`autocast_for_target(policy, "cuda")` therefore enters CPU autocast and, while it is active,
replaces the kernels at the AutocastCPU dispatch key with ones that apply CUDA's policy:

* ops both devices cast to lower precision (mm, linear, matmul, conv...) keep the C++ CPU
  kernel, which uses autocast's weight-cast cache (one half copy per parameter per forward);
* every other op CUDA autocasts gets a Python kernel applying CUDA's cast to the inputs
  (`.to(dtype)`, recorded by autograd as a real autocast cast is) and then running the op
  below autocast;
* ops only CPU autocasts run uncast (a fallthrough), as on CUDA.

The registrations are process-wide and undone on exit. They only act while CPU autocast is
enabled, so `cuda_autocast_kernels()` can also be held around a whole step (forward and
backward) for activation checkpointing, whose recomputation in backward re-enters CPU
autocast with the forward's settings.

Where the CUDA lists come from: `AT_FORALL_*` in ATen/autocast_mode.h and the AutocastCUDA
registrations in ATen/autocast_mode.cpp; tests check the table against this torch build.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
from torch.library import Library, fallthrough_kernel

from trainwise.techniques.precision import PrecisionPolicy
from trainwise.trace.process_wide import SharedPatch

# CUDA cast policies (names as in ATen's CastPolicy).
LOWER = "lower_precision_fp"  # cast floating inputs to the autocast dtype
FP32 = "fp32"  # cast floating inputs to float32
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # no dtype given and input floating: pass dtype=float32
FP32_APPEND_DTYPE = "fp32_append_dtype"  # call the overload that takes a dtype, with float32
PROMOTE = "promote"  # cast floating inputs to the widest floating input type
BANNED = "banned"  # CUDA autocast refuses the op


def _ops(category: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), category)


# Every op (aten overload name, "name" = default overload) CUDA autocast registers, with its policy.
CUDA_POLICY: dict[str, str] = {
    **_ops(LOWER, """
        _convolution _convolution.deprecated conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input convolution cudnn_convolution
        cudnn_convolution_transpose prelu addmm addmv addr matmul einsum mm mv linalg_vecdot
        linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell
        _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
        _scaled_dot_product_flash_attention scaled_dot_product_attention"""),
    **_ops(FP32, """
        acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
        pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm
        rms_norm group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity
        poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div
        l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
        soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits
        dist pdist cdist renorm logsumexp upsample_nearest1d _upsample_nearest_exact1d
        upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d
        upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d
        upsample_bicubic2d _upsample_bicubic2d_aa"""),
    **_ops(FP32_SET_OPT_DTYPE, """
        prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm
        linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList"""),
    **_ops(FP32_APPEND_DTYPE, "norm.Scalar norm.ScalarOpt_dim"),
    **_ops(PROMOTE, "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"),
    **_ops(BANNED, "binary_cross_entropy"),
}

# fp32_append_dtype: the overload without a dtype argument -> the one CUDA redispatches to.
APPEND_DTYPE_TARGET = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}

# CUDA lower-precision ops whose CPU autocast kernel is the same lower-precision cast: kept,
# so their weight casts go through autocast's cache exactly as on CUDA.
KEEP_CPU_KERNEL = tuple("""
    _convolution.deprecated conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d.input
    conv_transpose3d.input prelu addmm matmul mm linalg_vecdot linear addbmm baddbmm bmm
    scaled_dot_product_attention""".split())

# Ops CPU autocast casts but CUDA autocast does not: they run uncast, as on CUDA.
CPU_ONLY = tuple("""
    _addmm_activation _grid_sampler_2d_cpu_fallback _lu_with_info _native_multi_head_attention
    adaptive_avg_pool3d adaptive_max_pool3d avg_pool3d cat cholesky cholesky_inverse cholesky_solve
    conv1d.padding conv2d.padding conv3d.padding cross_entropy_loss ctc_loss.IntList ctc_loss.Tensor
    fake_quantize_per_tensor_affine fft_fft fft_fft2 fft_fftn fft_hfft fft_ifft fft_ifft2 fft_ifftn
    fft_ihfft fft_irfft fft_irfft2 fft_irfftn fft_rfft fft_rfft2 fft_rfftn fractional_max_pool2d
    fractional_max_pool3d geqrf grid_sampler_2d grid_sampler_3d index_copy
    inverse linalg_cholesky linalg_cholesky_ex linalg_cond linalg_cond.p_str linalg_eig linalg_eigh
    linalg_eigvals linalg_eigvalsh linalg_householder_product linalg_inv linalg_inv_ex linalg_lstsq
    linalg_matrix_rank linalg_matrix_rank.atol_rtol_float linalg_matrix_rank.atol_rtol_tensor
    linalg_matrix_rank.tol_tensor linalg_qr linalg_solve linalg_svd linalg_svdvals linalg_tensorinv
    linalg_tensorsolve lu_solve max_pool3d max_unpool2d max_unpool3d
    mkldnn_rnn_layer multilabel_margin_loss_forward nanquantile nanquantile.scalar orgqr ormqr
    pinverse polar qr quantile quantile.scalar reflection_pad1d reflection_pad2d replication_pad1d
    replication_pad2d replication_pad3d stack stft stft.center svd trace triangular_solve
    view_as_complex""".split())

_KEY = "AutocastCPU"
_OVERRIDE_WARNING = r"(?s).*Overriding a previously registered kernel"


def autocast_for_target(policy: PrecisionPolicy, target_device_type: str):
    """The autocast context the step's forward runs under, casting as `target_device_type` would."""
    if policy.autocast_dtype is None:
        return contextlib.nullcontext()
    if target_device_type == "cpu":
        return torch.autocast("cpu", dtype=policy.autocast_dtype)
    if target_device_type == "cuda":
        return _cuda_autocast_on_cpu(policy.autocast_dtype)
    raise ValueError(f"no autocast policy for device type {target_device_type!r} (expected 'cpu' or 'cuda')")


@contextlib.contextmanager
def _cuda_autocast_on_cpu(dtype: torch.dtype):
    with cuda_autocast_kernels(), torch.autocast("cpu", dtype=dtype):
        yield


def cuda_autocast_kernels():
    """While active, CPU autocast (wherever enabled, in any thread) casts like CUDA autocast."""
    return _CUDA_KERNELS.active()


def _register() -> Library:
    lib = Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_OVERRIDE_WARNING)
        for name, kernel in _kernels():
            lib.impl(name, kernel, _KEY)
    return lib


_CUDA_KERNELS = SharedPatch(install=lambda: _register(), remove=lambda library: library._destroy())


@functools.cache
def _kernels() -> tuple[tuple[str, object], ...]:
    """(op name, kernel) for every AutocastCPU registration the CUDA emulation makes."""
    kernels = {}
    for name, category in CUDA_POLICY.items():
        if name not in KEEP_CPU_KERNEL and _overload(name) is not None:
            kernels[name] = _python_kernel(name, category)
    # CPU_ONLY, plus any op a newer torch autocasts on CPU alone (tests flag those for the table).
    for name in (*CPU_ONLY, *sorted(_cpu_autocast_ops() - set(CUDA_POLICY))):
        if name not in kernels and name not in CUDA_POLICY and _overload(name) is not None:
            kernels[name] = fallthrough_kernel
    return tuple(kernels.items())


def registered_ops(key: str) -> set[str]:
    """aten ops with a kernel at dispatch key `key` in this build, as 'name' or 'name.overload'."""
    return {
        n.removeprefix("aten::")
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, key)
    }


@functools.cache
def _cpu_autocast_ops() -> frozenset[str]:
    return frozenset(registered_ops(_KEY))


def _overload(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


# ---- the kernels ------------------------------------------------------------------------


def _no_autocast():
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


def _eligible(t) -> bool:
    # CUDA's test is "a floating CUDA tensor, not float64"; the CPU tensors stand in for CUDA ones.
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 and t.device.type == "cpu"


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if _eligible(value) and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _cast_all(args, kwargs, dtype):
    return [_cast(a, dtype) for a in args], {k: _cast(v, dtype) for k, v in kwargs.items()}


def _promote_type(args, kwargs, lower: torch.dtype) -> torch.dtype:
    current = lower
    for t in _tensors([*args, *kwargs.values()]):
        if not _eligible(t):
            continue
        if current == torch.float32 or t.dtype == torch.float32:
            current = torch.float32
        elif t.dtype != lower:
            raise RuntimeError(f"CUDA autocast to {lower} cannot promote a {t.dtype} input")
    return current


def _python_kernel(name: str, category: str):
    op = _overload(name)
    makers = {LOWER: _lower_kernel, FP32: _fp32_kernel, PROMOTE: _promote_kernel,
              FP32_SET_OPT_DTYPE: _fp32_set_opt_dtype_kernel, FP32_APPEND_DTYPE: _fp32_append_dtype_kernel,
              BANNED: _banned_kernel}
    if category not in makers:
        raise ValueError(f"unknown autocast policy {category!r} for {name}")
    kernel = makers[category](name, op)
    kernel.__name__ = f"cuda_autocast_{category}_{name.replace('.', '_')}"
    return kernel


def _lower_kernel(name: str, op):
    # Unlike the C++ kernels, these casts cannot use autocast's weight-cast cache (it has no
    # Python API): a parameter cast here is cast again at each use. Only ops CPU does not
    # autocast itself land here (einsum, mv, addmv, convolution...), rarely fed weights.
    def kernel(*args, **kwargs):
        args, kwargs = _cast_all(args, kwargs, torch.get_autocast_dtype("cpu"))
        with _no_autocast():
            return op(*args, **kwargs)
    return kernel


def _fp32_kernel(name: str, op):
    def kernel(*args, **kwargs):
        args, kwargs = _cast_all(args, kwargs, torch.float32)
        with _no_autocast():
            return op(*args, **kwargs)
    return kernel


def _promote_kernel(name: str, op):
    def kernel(*args, **kwargs):
        dtype = _promote_type(args, kwargs, torch.get_autocast_dtype("cpu"))
        args, kwargs = _cast_all(args, kwargs, dtype)
        with _no_autocast():
            return op(*args, **kwargs)
    return kernel


def _fp32_set_opt_dtype_kernel(name: str, op):
    schema = op._schema
    index = next(i for i, a in enumerate(schema.arguments) if a.name == "dtype")
    dtype_is_positional = not schema.arguments[index].kwarg_only

    def kernel(*args, **kwargs):
        first = args[0] if args else kwargs.get(schema.arguments[0].name)
        if _eligible(first):  # an explicit dtype is respected; an ineligible input runs as is
            if dtype_is_positional and len(args) > index:
                if args[index] is None:
                    args = (*args[:index], torch.float32, *args[index + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        with _no_autocast():
            return op(*args, **kwargs)
    return kernel


def _fp32_append_dtype_kernel(name: str, op):
    target = _overload(APPEND_DTYPE_TARGET[name])
    positional = [a for a in op._schema.arguments if not a.kwarg_only]

    def kernel(*args, **kwargs):
        # All positional arguments, defaults filled in (some callers omit trailing ones).
        values = list(args)
        for a in positional[len(values):]:
            values.append(kwargs[a.name] if a.name in kwargs else a.default_value)
        dtype = torch.float32 if _eligible(values[0]) else values[0].dtype
        with _no_autocast():
            return target(*values, dtype=dtype)
    return kernel


def _banned_kernel(name: str, op):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"aten::{name} is refused by CUDA autocast (unsafe in half precision); models "
            "usually apply a sigmoid first, so use binary_cross_entropy_with_logits "
            "(nn.BCEWithLogitsLoss) instead"
        )
    return kernel
