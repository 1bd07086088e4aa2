"""Distributed checkpoints reshard: saved by 4 ranks under ZeRO-3, resumed by 2 ranks
under DDP and by 4 under tensor x data parallel, each continuing the loss curve of an
uninterrupted run; exported whole without a process group. GPT-2's fused q/k/v weight
reshards from tensor parallel to ZeRO-3.

The commands run in this process through `trainwise.cli.main.main`, as a shell would run
them less the start-up of a Python that imports torch (seconds each on a 2-core machine):
`train --nproc N` still starts torchrun and N fresh worker processes, and this process has
no process group of its own for `export` to find."""

import json
import subprocess

import pytest
import torch

from distributed_launch import REPO
from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.run_config import RunConfig
from trainwise.plan.plan import Plan

COMMON = ["tiny-llama", "--device", "cpu", "--data", "synthetic", "--batch-size", "2", "--seq-len", "32",
          "--lr", "1e-3", "--lr-schedule", "constant", "--log-every", "1"]


def _train(args: list[str], metrics, common: list[str] = COMMON) -> list[float]:
    assert main(["train", *common, *args, "--metrics", str(metrics)]) == 0  # the job's stderr: pytest's report
    return [line["loss"] for line in map(json.loads, metrics.read_text().splitlines()) if "loss" in line]


def _export(checkpoint, out) -> None:
    assert not torch.distributed.is_initialized(), "export is checked without a process group"
    assert main(["export", str(checkpoint), "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """4 ranks, ZeRO-3, 2 steps of 4 x 2 samples, checkpoint at step 2; plus the loss
    curve one process gets for the same 8 samples per step over 4 steps."""
    tmp = tmp_path_factory.mktemp("dcp")
    first = _train(["--nproc", "4", "--zero", "3", "--steps", "2", "--output", str(tmp / "run")], tmp / "a.jsonl")
    reference = []
    train("tiny-llama", plan=Plan.from_dict({"batch_size": 2, "grad_accum": 4, "seq_len": 32, "lr": 1e-3,
                                             "lr_schedule": "constant", "device": "cpu"}),
          run=RunConfig.from_dict({"steps": 4, "data": "synthetic", "timing_warmup": 0}),
          on_step=lambda entry: reference.append(entry.outcome.loss))
    return tmp, first, reference


@pytest.mark.distributed
@pytest.mark.parametrize("layout", [["--nproc", "2"], ["--nproc", "4", "--tp", "2"]], ids=["DDP x 2", "TP 2 x DP 2"])
def test_resume_under_another_layout(saved, tmp_path, layout):
    tmp, first, reference = saved
    assert first == pytest.approx(reference[:2], rel=2e-5)
    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(tmp / "run"), str(run)], check=True)
    # Same 8 samples per step: 2 data-parallel ranks x accumulation 2 x batch 2.
    resumed = _train([*layout, "--grad-accum", "2", "--steps", "4", "--output", str(run), "--resume"],
                     tmp_path / "b.jsonl")
    assert resumed == pytest.approx(reference[2:], rel=2e-5)
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "final")
    assert all(torch.isfinite(p).all() for p in final.parameters())


@pytest.mark.distributed
def test_export_without_a_process_group(saved, tmp_path):
    tmp, _, _ = saved
    checkpoint = tmp / "run" / "checkpoints" / "step-00000002"
    _export(checkpoint, tmp_path / "hf")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    dcp_to_torch_save(checkpoint / "dcp", tmp_path / "full.pt")
    saved_weights = torch.load(tmp_path / "full.pt", weights_only=True)["model"]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert set(saved_weights) <= set(exported)
    for name, tensor in saved_weights.items():
        assert torch.equal(exported[name], tensor), name
    # The run's --output (or its checkpoints/latest pointer) means its newest checkpoint.
    from trainwise.api.export import export_checkpoint

    for alias in (tmp / "run", tmp / "run" / "checkpoints" / "latest"):
        again = export_checkpoint(alias, tmp_path / f"hf-{alias.name}")
        assert (again / "model.safetensors").read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()


def test_export_refuses_what_is_not_a_checkpoint(tmp_path, capsys):
    code = main(["export", str(tmp_path), "--out", str(tmp_path / "x")])
    stderr = capsys.readouterr().err
    assert code == 2 and "CHECKPOINT" in stderr and len(stderr.strip().splitlines()) == 1


@pytest.mark.distributed
def test_gpt2_reshards_between_tensor_pipeline_and_sharded_layouts(tmp_path):
    """GPT-2 holds q, k and v in one weight, which tensor parallel splits per part, and ties
    its head to the embedding, which pipeline parallel puts on two ranks: saved by TP 2
    (accumulation 2), resumed by PP 2 (interleaved: two stages per rank, held in a
    ModuleList whose names the checkpoint drops), then by ZeRO-3 on 2 ranks, the curve continues one
    process's; the TP run's own final/ equals `trainwise export` of its checkpoint."""
    model = tmp_path / "tiny-gpt2"  # the catalog's, without dropout (TP draws its masks per head slice),
    model.mkdir()                   # with 4 blocks for interleaved 1F1B's 2 stages per rank
    config = json.loads((REPO / "trainwise/models/catalog/tiny-gpt2.json").read_text())
    config.pop("trainwise")
    (model / "config.json").write_text(json.dumps({**config, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                                   "attn_pdrop": 0.0, "n_layer": 4}))
    common = [str(model), *COMMON[1:]]
    run = tmp_path / "run"
    first = _train(["--nproc", "2", "--tp", "2", "--grad-accum", "2", "--steps", "2", "--output", str(run)],
                   tmp_path / "a.jsonl", common)
    reference = []
    train(str(model), plan=Plan.from_dict({"batch_size": 2, "grad_accum": 2, "seq_len": 32, "lr": 1e-3,
                                           "lr_schedule": "constant", "device": "cpu"}),
          run=RunConfig.from_dict({"steps": 6, "data": "synthetic", "timing_warmup": 0}),
          on_step=lambda entry: reference.append(entry.outcome.loss))
    assert first == pytest.approx(reference[:2], rel=2e-5)

    _export(run, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    final = AutoModelForCausalLM.from_pretrained(run / "final").state_dict()
    assert exported.keys() == final.keys()
    for name, tensor in final.items():
        assert torch.equal(exported[name], tensor), name

    piped = _train(["--nproc", "2", "--pp", "2", "--pp-schedule", "interleaved-1f1b", "--microbatches", "2",
                    "--grad-accum", "2", "--steps", "4", "--output", str(run),
                    "--resume"], tmp_path / "b.jsonl", common)
    assert piped == pytest.approx(reference[2:4], rel=2e-5)
    sharded = _train(["--nproc", "2", "--zero", "3", "--steps", "6", "--output", str(run), "--resume"],
                     tmp_path / "c.jsonl", common)
    assert sharded == pytest.approx(reference[4:], rel=2e-5)
