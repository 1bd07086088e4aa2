"""Every data-parallel layout on gloo reproduces the single-process loss curve.

With W ranks of micro-batch b and accumulation a, rank r's k-th micro-batch is number
k*W + r of the one synthetic stream, so one process with micro-batch b and accumulation
a*W sees exactly the same samples per step: the losses must agree to float tolerance."""

import json

import pytest

from distributed_launch import CASES_WORKER, REPO, launch
from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.run_config import RunConfig
from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan

STEPS = 5
BASE = {"batch_size": 2, "seq_len": 32, "lr": 1e-3}

FOUR_BLOCKS = {"num_hidden_layers": 4}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
GPT2_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
TWO_RANKS = {  # name: (model, knobs[, config changes])
    "DDP": ("tiny-llama", {}),
    "ZeRO-1": ("tiny-llama", {"zero": 1}),
    "ZeRO-2": ("tiny-llama", {"zero": 2}),
    "ZeRO-3": ("tiny-llama", {"zero": 3}),
    "ZeRO-3 + CPU offload": ("tiny-llama", {"zero": 3, "cpu_offload": True}),
    "DDP, accumulation 2": ("tiny-llama", {"grad_accum": 2}),
    "ZeRO-3, accumulation 2": ("tiny-llama", {"zero": 3, "grad_accum": 2}),
    "ZeRO-3, checkpointing": ("tiny-llama", {"zero": 3, "grad_ckpt": True}),
    "ZeRO-3, selective checkpointing": ("tiny-llama", {"zero": 3, "grad_ckpt": True, "grad_ckpt_policy": "selective"}),
    "TP 2, selective checkpointing every 2": ("tiny-llama", {"tp": 2, "grad_ckpt": True, "grad_ckpt_policy": "selective",
                                                             "grad_ckpt_every": 2}, FOUR_BLOCKS),
    "DDP, LoRA": ("tiny-llama", {"lora_rank": 4}),
    "ZeRO-3, LoRA": ("tiny-llama", {"zero": 3, "lora_rank": 4}),
    "MoE, ZeRO-3": ("tiny-mixtral", {"zero": 3}),
    "TP 2": ("tiny-llama", {"tp": 2}),
    "TP 2, vocabulary 4096": ("tiny-llama", {"tp": 2}, {"vocab_size": 4096}),
    "TP 2, sequence parallel": ("tiny-llama", {"tp": 2, "sequence_parallel": True}),
    "TP 2, BERT": ("tiny-bert", {"tp": 2}, NO_DROPOUT),
    # Post-norm blocks, position and token-type embeddings added whole; the masked-LM head after a gather.
    "TP 2, BERT, sequence parallel": ("tiny-bert", {"tp": 2, "sequence_parallel": True}, NO_DROPOUT),
    # Conv1D projections: the row-wise ones reduce-scatter; ln_f's output gathered before the reshape.
    "TP 2, GPT-2, sequence parallel": ("tiny-gpt2", {"tp": 2, "sequence_parallel": True}, GPT2_NO_DROPOUT),
    # GPT-2: fused q/k/v, tied head; 1023 rows do not divide by 2 (GPT-2's own 50257 do not).
    "TP 2, GPT-2, odd vocabulary": ("tiny-gpt2", {"tp": 2}, {**GPT2_NO_DROPOUT, "vocab_size": 1023}),
    "PP 2, GPipe": ("tiny-llama", {"pp": 2, "pp_schedule": "gpipe", "microbatches": 2}),
    "PP 2, 1F1B, accumulation 2": ("tiny-llama", {"pp": 2, "microbatches": 2, "grad_accum": 2}),
    "PP 2, interleaved 1F1B": ("tiny-llama", {"pp": 2, "pp_schedule": "interleaved-1f1b", "microbatches": 2},
                               FOUR_BLOCKS),
    # The head is tied to the embedding: the first and last stage add their gradients.
    "PP 2, GPT-2": ("tiny-gpt2", {"pp": 2, "microbatches": 2}, GPT2_NO_DROPOUT),
    # Mistral attends within a window (8 tokens here, of 32): each stage must build that mask.
    "PP 2, Mistral window": (str(REPO / "tests/models/tiny-mistral-window"), {"pp": 2, "microbatches": 2}),
}
FOUR_RANKS = {
    "DDP x 4": ("tiny-llama", {}),
    "ZeRO-3 x 4": ("tiny-llama", {"zero": 3}),
    "hybrid: 2 replicas x 2 shards": ("tiny-llama", {"fsdp": 2}),
    "TP 2 x DP 2": ("tiny-llama", {"tp": 2}),
    "TP 2 x ZeRO-3 2": ("tiny-llama", {"tp": 2, "zero": 3}),
    "TP 2 x ZeRO-3 2, GPT-2": ("tiny-gpt2", {"tp": 2, "zero": 3}, GPT2_NO_DROPOUT),
    "PP 4, 1F1B": ("tiny-llama", {"pp": 4, "batch_size": 4, "microbatches": 4}, FOUR_BLOCKS),
    "PP 2 x DP 2": ("tiny-llama", {"pp": 2, "microbatches": 2}),
    "TP 2 x PP 2": ("tiny-llama", {"tp": 2, "pp": 2, "microbatches": 2}),
    "TP 2 x PP 2, GPT-2": ("tiny-gpt2", {"tp": 2, "pp": 2, "microbatches": 2}, GPT2_NO_DROPOUT),
    # The stages pass sequence slices; the second derives positions and its mask from slice x tp.
    "TP 2 + SP x PP 2": ("tiny-llama", {"tp": 2, "sequence_parallel": True, "pp": 2, "microbatches": 2}),
    "TP 2 + SP x PP 2, GPT-2": ("tiny-gpt2", {"tp": 2, "sequence_parallel": True, "pp": 2, "microbatches": 2},
                                GPT2_NO_DROPOUT),
    # A window of 8 of 32 tokens: the second stage's mask must be built for the whole length.
    "TP 2 + SP x PP 2, Mistral window": (str(REPO / "tests/models/tiny-mistral-window"),
                                         {"tp": 2, "sequence_parallel": True, "pp": 2, "microbatches": 2}),
}
# Layouts whose whole peak the CPU probe sees (engine/memory_probe.py; not DDP's gradient
# buckets or the pipeline's receive buffers, held in C++ from before the profiled step) and
# sees the same in every run. Where FSDP2's asynchronous all-gathers overlap compute, the
# measured peak moved by up to the root unit's gathered parameters from run to run (ZeRO-3
# x 4: -0.0 % in three runs, -15.4 % in one made on a loaded machine), so those cases are
# printed (`pytest -s`), not asserted; docs/parallel.md gives the figures.
# Sequence parallel is printed too: its reduce-scatters complete lazily (functional
# collectives), and its measured peak moved by 65 KB between two runs (-3.2 % and -0.5 %).
# So is TP 2 on BERT: its measured peak moved by up to 148 KB from run to run on one
# machine and one commit (-5.8 %, -2.6 %, -1.3 % in three runs, 2026-11-29; its sequence-
# parallel twin -0.0 % to -2.3 %), the prediction unchanged.
PEAK_MEASURED_STEADILY = ("DDP, accumulation 2", "TP 2", "TP 2, vocabulary 4096", "TP 2 x DP 2",
                          "TP 2, GPT-2, odd vocabulary")
LAYOUT_ONLY = ("zero", "cpu_offload", "fsdp", "tp", "sequence_parallel", "pp", "pp_schedule", "microbatches")


def _cases(layouts: dict) -> list[dict]:
    return [{"name": name, "model": entry[0], "knobs": {**BASE, **entry[1]}, "steps": STEPS,
             "config": entry[2] if len(entry) > 2 else {}} for name, entry in layouts.items()]


def _single_process(case: dict, world: int, steps: int = STEPS) -> list[float]:
    """The same samples per step on one process: accumulation takes the place of the other
    data-parallel ranks (tensor- and pipeline-parallel peers share their samples)."""
    from workers.parallel_engine_worker import model_spec

    knobs = case["knobs"]
    data_parallel = world // (knobs.get("tp", 1) * knobs.get("pp", 1))
    single = {k: v for k, v in knobs.items() if k not in LAYOUT_ONLY}
    single["grad_accum"] = single.get("grad_accum", 1) * data_parallel
    losses = []
    train(model_spec(case), plan=Plan.from_dict({**single, "device": "cpu"}),
          run=RunConfig.from_dict({"steps": steps, "data": "synthetic", "timing_warmup": 0}),
          on_step=lambda entry: losses.append(entry.outcome.loss))
    return losses


# Rank 1 started with another learning rate than rank 0: both must refuse it. Run last in
# the two-rank launch (each case is its own train() call), so no layout follows a refusal.
RANKS_DIFFER = {**_cases({"mismatch": ("tiny-llama", {})})[0], "rank_knobs": {"1": {"lr": 5e-4}}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    two = launch(CASES_WORKER, 2, tmp, [json.dumps([*_cases(TWO_RANKS), RANKS_DIFFER])], timeout_s=400)
    four = launch(CASES_WORKER, 4, tmp, [json.dumps(_cases(FOUR_RANKS))], timeout_s=400)
    for done in (two, four):
        assert done.returncode == 0, done.stderr[-3000:]
    return {2: two.rank_outputs, 4: four.rank_outputs}


@pytest.fixture(scope="module")
def references():
    """One-process loss curves by what decides them, for both worlds: a 4-rank layout with a
    2-rank layout's samples per step (TP 2 x DP 2 and DDP x 2) is compared with the same curve."""
    return {}


@pytest.mark.distributed
@pytest.mark.parametrize("world, layouts", [(2, TWO_RANKS), (4, FOUR_RANKS)])
def test_layouts_match_one_process(runs, references, world, layouts):
    for case in _cases(layouts):
        knobs = case["knobs"]
        key = (case["model"], json.dumps(case["config"], sort_keys=True), world // (knobs.get("tp", 1) * knobs.get("pp", 1)),
               tuple(sorted((k, v) for k, v in knobs.items() if k not in LAYOUT_ONLY)))
        if key not in references:
            references[key] = _single_process(case, world)
        name = case["name"]
        for rank, output in runs[world].items():
            result = output[name]
            assert "error" not in result, f"{name} on rank {rank}: {result.get('traceback')}"
            assert result["losses"] == pytest.approx(references[key], rel=2e-5), f"{name} on rank {rank}"


@pytest.mark.distributed
@pytest.mark.parametrize("world, layouts", [(2, TWO_RANKS), (4, FOUR_RANKS)])
def test_per_rank_estimate_matches_rank_0_model_states(runs, world, layouts):
    """`trainwise estimate` with the same layout predicts rank 0's weights, gradients and
    optimizer states to the byte (CPU offload: all three in host memory), and rank 0's
    peak within 5 % where the CPU probe measures all of it steadily. Under LoRA the
    worker sees only the trainable weights, so weights are not compared there."""
    from trainwise.api.estimate import estimate
    from workers.parallel_engine_worker import model_spec

    checked = []
    for case in _cases(layouts):
        plan = Plan.from_dict({**case["knobs"], "device": "cpu", "nproc": world})
        checked.append((case["name"], plan, estimate(model_spec(case), plan).memory, runs[world][0][case["name"]]))
    # The peak comparison of every case, for docs/parallel.md (shown with `pytest -s`).
    for name, _, memory, run in checked:
        error = (memory.peak_allocated - run["peak_allocated"]) / run["peak_allocated"] * 100
        print(f"rank-0 peak, {world} ranks, {name}: predicted {memory.peak_allocated:,} B, "
              f"measured {run['peak_allocated']:,} B ({error:+.1f} %)")
    for name, plan, memory, run in checked:
        real = run["state_bytes"]
        predicted = {"weights": memory.weights, "gradients": memory.gradients, "optimizer": memory.optimizer}
        if plan.lora:
            real, predicted = ({k: v for k, v in d.items() if k != "weights"} for d in (real, predicted))
        if plan.cpu_offload:
            assert memory.host == sum(real.values()), name
        else:
            assert predicted == real, name
        if name in PEAK_MEASURED_STEADILY:
            assert memory.peak_allocated == pytest.approx(run["peak_allocated"], rel=0.05), name


@pytest.mark.distributed
def test_plans_that_differ_across_ranks_are_refused(runs):
    for rank in (0, 1):
        error = runs[2][rank][RANKS_DIFFER["name"]]["error"]
        assert "rank 1 was started with other settings than rank 0" in error and "plan.lr" in error


@pytest.mark.distributed
def test_a_failing_rank_ends_the_job_with_its_error(tmp_path):
    case = {**_cases({"fails": ("tiny-llama", {})})[0], "fail_on_rank": "1"}
    done = launch(CASES_WORKER, 2, tmp_path, [json.dumps([case])], timeout_s=200)  # a hang would time out here
    assert done.returncode != 0 and "rank 1 fails on purpose" in done.stderr


@pytest.mark.distributed
def test_cli_launches_processes_with_nproc(tmp_path):
    """The command as a shell runs it, less the start-up of a Python for the launcher: it
    still starts torchrun and two fresh workers (its stderr goes to pytest's report). The
    run's tokenizer is saved beside the final model, as a one-process run saves it."""
    from test_chat_data import CONVERSATION, chat_tokenizer_dir, write_jsonl
    from transformers import AutoTokenizer

    tokenizer, _ = chat_tokenizer_dir(tmp_path)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 8)
    metrics, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    assert main(["train", "tiny-llama", "--nproc", "2", "--zero", "2", "--device", "cpu", "--steps", "3",
                 "--data", str(data), "--chat", "messages", "--tokenizer", str(tokenizer), "--batch-size", "2",
                 "--seq-len", "32", "--metrics", str(metrics), "--out", str(out), "--no-chart"]) == 0
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines[:-1]] == [1, 2, 3] and "summary" in lines[-1]
    assert (out / "final" / "tokenizer.json").is_file()
    assert AutoTokenizer.from_pretrained(out / "final").get_vocab() == AutoTokenizer.from_pretrained(tokenizer).get_vocab()


def test_cli_bad_layout_is_one_line_exit_2(capsys):
    code = main(["train", "tiny-llama", "--nproc", "3", "--tp", "2", "--device", "cpu"])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.strip().startswith("trainwise: error: --nproc")
    assert len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("classic", ["data-parallel", "vertical"])
def test_classic_layouts_are_refused_on_one_device(classic):
    """On a CPU both classic layouts would have one device to use and change nothing, so the
    request is refused rather than ignored (what they add on several GPUs is placement,
    checked below)."""
    with pytest.raises(InputError) as refused:
        train("tiny-llama", plan=Plan.from_dict({**BASE, "device": "cpu", "classic": classic}),
              run=RunConfig.from_dict({"steps": 3, "data": "synthetic", "timing_warmup": 0}))
    assert refused.value.field == "--classic" and "on cpu there is one device" in refused.value.message


def test_vertical_placement_spreads_blocks_in_order():
    import torch

    from trainwise.engine.parallel.classic import assign_blocks, place_vertically
    from trainwise.models import build_model, resolve_model

    assert assign_blocks(4, ["gpu0", "gpu1"]) == ["gpu0", "gpu0", "gpu1", "gpu1"]
    assert assign_blocks(5, ["gpu0", "gpu1", "gpu2"]) == ["gpu0", "gpu0", "gpu1", "gpu1", "gpu2"]
    model = build_model(resolve_model("tiny-llama"), "cpu")
    devices = [torch.device("cpu")] * 2  # placement logic only; hops are no-ops on one CPU
    placement = place_vertically(model, devices)
    blocks = len(model.model.layers)
    assert len(placement) == blocks
    batch = {"input_ids": torch.randint(0, 100, (2, 16)), "labels": torch.randint(0, 100, (2, 16))}
    assert torch.isfinite(model(**batch).loss)


def test_vertical_placement_spreads_every_stack_of_an_encoder_decoder():
    """tiny-t5 has two stacks of two T5Blocks; the longest ModuleList is one decoder block's
    three sublayers, which vertical used to spread while the encoder stayed on the first
    device. The four blocks are the units, encoder's then decoder's, two per device; the
    encoder's final norm stays with the encoder's last block, the head goes last."""
    import torch

    from trainwise.engine.parallel.classic import assign_blocks, outside_devices, place_vertically
    from trainwise.models import build_model, resolve_model

    model = build_model(resolve_model("tiny-t5"), "cpu")
    blocks = [*model.encoder.block, *model.decoder.block]
    devices = [torch.device("cpu", 0), torch.device("cpu", 1)]  # distinct stand-ins; the tensors stay on the CPU
    assert place_vertically(model, devices) == [devices[0], devices[0], devices[1], devices[1]]
    assert [m for m in model.modules() if type(m).__name__ == "T5Block" and m._forward_pre_hooks] == blocks
    assert not any(sublayer._forward_pre_hooks for block in blocks for sublayer in block.layer)

    four = ["gpu0", "gpu1", "gpu2", "gpu3"]
    outside = {name: device for name, _, device in outside_devices(model, blocks, assign_blocks(4, four), four[-1])}
    assert outside["encoder.final_layer_norm"] == "gpu1" and outside["encoder.dropout"] == "gpu1"
    assert outside["decoder.final_layer_norm"] == "gpu3" and outside["lm_head"] == "gpu3"
    assert "shared" not in outside and "encoder.embed_tokens" not in outside  # before the first block: first device

    batch = {"input_ids": torch.randint(0, 100, (2, 16)), "labels": torch.randint(0, 100, (2, 8))}
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for block in blocks for p in block.parameters() if p.requires_grad)


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_data_tensor_sequence_and_pipeline_parallel_match_one_process(tmp_path):
    """The large-model layout at its smallest: ZeRO-3 over 2 replicas x tensor + sequence
    parallel 2 x pipeline 2 is 8 ranks, one launch, 10 steps; every rank's losses equal
    one process's with the same samples per step (accumulation 2 for the 2 replicas)."""
    layouts = {"ZeRO-3 2 x TP 2 + SP x PP 2": ("tiny-llama", {"zero": 3, "tp": 2, "sequence_parallel": True, "pp": 2,
                                                               "microbatches": 2})}
    case = {**_cases(layouts)[0], "steps": 10}
    done = launch(CASES_WORKER, 8, tmp_path, [json.dumps([case])], timeout_s=500)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = _single_process(case, 8, steps=10)
    assert len(reference) == 10
    for rank, output in done.rank_outputs.items():
        result = output[case["name"]]
        assert "error" not in result, f"rank {rank}: {result.get('traceback')}"
        assert result["losses"] == pytest.approx(reference, rel=1e-4), f"rank {rank}"
