"""--float8 with --tp: the block projections the family splits become torchao Float8Linear
before the split (judged on the widths one rank multiplies), are split with torchao's
float8 styles, and `estimate` prices the layout for a GPU target (float8 matmuls on the
per-rank shapes; under FSDP2 the weights all-gathered at one byte). Running it needs a
CUDA GPU of compute capability 8.9+: the GPU stage `tp-compile` of
benchmarks/gpu_validation.sh checks it there. Every test needs torchao (tests/float8_package.py)."""

import json

import pytest
import torch

from float8_package import needs_torchao  # noqa: E402

pytestmark = pytest.mark.float8
needs_torchao()

from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel  # noqa: E402
from torch.distributed.tensor import Shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel  # noqa: E402

from trainwise.api.estimate import estimate  # noqa: E402
from trainwise.engine.parallel.tensor_parallel import _style, convert_float8_before_split  # noqa: E402
from trainwise.models.build import build_model  # noqa: E402
from trainwise.models.resolve import resolve_model  # noqa: E402
from trainwise.plan.plan import Plan  # noqa: E402

F8_TP = {"device": "h100", "precision": "bf16", "float8": True, "compile": True, "batch_size": 2, "seq_len": 64}
ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")


def _converted(tp: int) -> tuple[torch.nn.Module, set[str]]:
    torch.manual_seed(0)
    model = build_model(resolve_model("tiny-llama"), "cpu")
    model = convert_float8_before_split(model, Plan.from_dict({**F8_TP, "nproc": tp, "tp": tp}), tp)
    return model, {name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"}


def test_float8_before_the_split_converts_the_split_projections_on_their_rank_widths():
    """tiny-llama: attention 64 wide, MLP 176 wide. One process converts both (multiples of
    16); at tp 2 a rank multiplies 88 MLP columns, not a multiple of 16, so the MLP stays
    bf16 while the attention (32 columns per rank) converts."""
    model, converted = _converted(tp=2)
    blocks = len(model.model.layers)
    assert converted == {f"model.layers.{i}.{path}" for i in range(blocks) for path in ATTENTION}
    assert model.lm_head.__class__ is torch.nn.Linear, "the head stays bf16"


def test_converted_projections_get_torchaos_float8_styles_and_the_rest_keep_dtensors():
    model, _ = _converted(tp=2)
    block = model.model.layers[0]
    assert isinstance(_style("colwise", False, block.self_attn.q_proj), Float8ColwiseParallel)
    rowwise = _style("rowwise", True, block.self_attn.o_proj)
    assert isinstance(rowwise, Float8RowwiseParallel) and rowwise.output_layouts == (Shard(1),)
    plain = _style("colwise", False, torch.nn.Linear(64, 64))
    assert type(plain) is ColwiseParallel


@pytest.mark.slow
def test_estimate_prices_float8_with_tensor_parallel_for_a_gpu_target():
    """Once refused; now priced: the FSDP2 all-gather of the float8 block weights moves one
    byte per element (plus a scale) instead of two, over the same tp-sharded weights."""
    spec = resolve_model("tiny-llama")
    gathered = {}
    for float8 in (False, True):
        plan = Plan.from_dict({**F8_TP, "float8": float8, "nproc": 4, "tp": 2, "zero": 3})
        result = estimate(spec, plan)
        gathered[float8] = next(c["bytes"] for c in result.time.collectives if c["name"] == "all_gather")
        assert result.layout is not None and result.time.step_s > 0
    assert gathered[True] < gathered[False]


@pytest.mark.slow
@pytest.mark.distributed
def test_float8_split_over_two_ranks_trains_near_the_bf16_split(tmp_path):
    """gloo, tp 2, eager (torch 2.13 has CPU float8 matmuls: this checks the split's
    numerics, not its speed; --float8 itself stays refused on a CPU target). The float8
    losses differ from bf16's (the rounding is real) by at most 5 %, the script's tolerance."""
    from distributed_launch import REPO, launch

    out = tmp_path / "tp-float8.json"
    done = launch(REPO / "benchmarks" / "tp_compile_check.py", 2, tmp_path,
                  ["--device", "cpu", "--only", "float8 eager", "--steps", "3", "--out", str(out)], timeout_s=400)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    float8, bf16 = report["variants"]["float8 eager"], report["variants"]["eager"]
    assert (float8["q_proj"], float8["q_proj_weight"]) == ("Float8Linear", "DTensor")
    assert float8["losses"] != bf16["losses"]
    assert report["checks"]["float8 eager near bf16 eager"]["ok"], report["checks"]
