"""`trainwise plan`, `--plan auto` and `--batch-size auto` from the command line: bad input is
one line naming the binding constraint (exit 2, before any trace), the table and JSON show
what was predicted, and `--batch-size auto` picks the largest micro-batch that fits."""

from __future__ import annotations

import json

import pytest

from test_search import GIB, formula
from trainwise.api import search as search_api
from trainwise.cli.main import main
from trainwise.api.auto_choice import AutoRequest, pinned_argv, train_stepping_down
from trainwise.cli.train_auto import say
from trainwise.common.errors import OutOfMemory
from trainwise.plan import Plan
from trainwise.search.compose import Measure


def _use(monkeypatch, evaluate):
    """The CLI's search judges plans with `evaluate` instead of the estimator."""
    monkeypatch.setattr(search_api, "estimate_evaluator", lambda spec, profile=None: evaluate)


def _never(plan):
    raise AssertionError(f"a plan was evaluated before the request was refused: {plan}")


def _refused(capsys, argv, field):
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith(f"trainwise: error: {field}: "), err
    return err[0]


PLAN = ["plan", "tiny-llama", "--device", "H100", "--seq-len", "64"]


@pytest.mark.parametrize("flags, field, says", [
    (["--gpus", "2", "--dp", "2", "--global-batch", "3"], "--global-batch", "--global-batch 2 or --global-batch 4"),
    (["--batch-size", "3", "--global-batch", "8"], "--batch-size", "closest: --global-batch 6 or --global-batch 9"),
    (["--allow", "lora,magic"], "--allow", "allowed: lora, adamw-8bit, adafactor, bf16-pure, fp16"),
    (["--gpus", "0"], "--gpus", ">= 1"),
    (["--top", "0"], "--top", ">= 1"),
    (["--device", "H999"], "--device", "unknown GPU 'H999'"),
    (["--device", "V100", "--precision", "bf16"], "--precision", "use fp16"),
])
def test_bad_input_is_refused_before_any_plan_is_evaluated(flags, field, says, monkeypatch, capsys, fault_log):
    _use(monkeypatch, _never)
    argv = PLAN + flags if "--device" not in flags else PLAN[:2] + ["--seq-len", "64"] + flags
    message = _refused(capsys, argv, field)
    assert says in message
    fault_log(kind="bad input", case=f"trainwise {' '.join(argv)}", exit_code=2, message=message)


def test_nothing_fits_names_the_smallest_plan_its_shortfall_and_what_would_help(monkeypatch, capsys, fault_log):
    _use(monkeypatch, lambda plan: Measure(200 * GIB + plan.batch_size, 1.0))
    argv = PLAN + ["--global-batch", "8"]
    message = _refused(capsys, argv, "memory")
    assert "no plan fits H100-80GB" in message and "the smallest, `trainwise train tiny-llama --batch-size 1" in message
    assert "GiB over" in message and "--allow lora,adafactor,adamw-8bit,bf16-pure would add plans" in message
    fault_log(kind="bad input", case="trainwise plan tiny-llama --device H100 (every plan needs 200 GiB)",
              exit_code=2, message=message)


def test_a_fixed_flag_that_makes_every_plan_miss_is_named(monkeypatch, capsys, fault_log):
    _use(monkeypatch, lambda plan: Measure(plan.batch_size * 10 * GIB, 1.0))
    argv = PLAN + ["--batch-size", "16"]
    message = _refused(capsys, argv, "memory")
    assert "held fixed: --batch-size 16" in message and "--seq-len 64" in message
    fault_log(kind="bad input", case=f"trainwise {' '.join(argv)} (16 rows need 160 GiB)", exit_code=2,
              message=message)


def test_the_json_lists_the_ranked_plans_with_predictions_flags_and_plan_files(monkeypatch, capsys, tmp_path):
    _use(monkeypatch, formula)
    code = main(PLAN + ["--global-batch", "16", "--top", "2", "--json", "--out", str(tmp_path),
                        "--emit", "deepspeed", "--emit-out", str(tmp_path / "ds.json")])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ranked_by"] == "tokens_per_s" and len(data["plans"]) == 2
    best = data["plans"][0]
    # Faster first, or a slower plan tied with it within the measured error (simpler), saying so.
    assert best["exact"] and best["source"] == "predicted" and (
        best["tokens_per_s"] >= data["plans"][1]["tokens_per_s"] or best["notes"][0].startswith("tied with"))
    assert best["flags"].startswith("trainwise train tiny-llama --batch-size")
    written = Plan.from_dict({k: v for k, v in _yaml(best["plan_file"]).items()})
    assert written.to_dict() == best["plan"]
    assert json.loads((tmp_path / "ds.json").read_text())["train_micro_batch_size_per_gpu"] == best["plan"]["batch_size"]
    assert any(a["technique"] == "grad_ckpt" for a in data["alternatives"])


def _yaml(path):
    import yaml

    with open(path) as handle:
        return yaml.safe_load(handle)


def test_batch_size_auto_in_estimate_picks_the_largest_micro_batch_that_fits_and_says_so(capsys):
    code = main(["estimate", "tiny-llama", "--device", "T4", "--seq-len", "32", "--batch-size", "auto",
                 "--global-batch", "2", "--json"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["plan"]["batch_size"] == 2
    assert "--batch-size auto picked 2 (x 1 accumulation): predicted" in captured.err


@pytest.mark.slow
def test_batch_size_auto_is_the_largest_micro_batch_under_the_usable_memory():
    """Real estimates of tiny-llama on a catalog GPU, with a capacity between the needs of
    micro-batches 4 and 8: auto picks 4, keeps the global batch of 16, and steps down to 2."""
    from trainwise.api.batch_auto import largest_fitting_batch
    from trainwise.api.estimate import estimate
    from trainwise.models import resolve_model

    spec, plan = resolve_model("tiny-llama"), Plan(device="A100-80GB", seq_len=256, precision="bf16")
    need = {mb: estimate(spec, plan.replace(batch_size=mb)).memory.device_total for mb in (4, 8)}
    assert need[4] < need[8]
    picked = largest_fitting_batch(spec, plan, global_batch=16, margin=0.0, capacity_bytes=(need[4] + need[8]) // 2)
    assert (picked.plan.batch_size, picked.plan.grad_accum) == (4, 4)
    assert (picked.smaller.batch_size, picked.smaller.grad_accum) == (2, 8)


@pytest.mark.fault
def test_batch_size_auto_steps_down_once_after_a_first_step_out_of_memory_and_never_loops(capsys, fault_log):
    request = AutoRequest(plan=False, batch=True, global_batch=None, margin=0.05, fixed=frozenset(),
                          smaller=Plan(batch_size=4))
    tried = []

    def out_of_memory(plan):
        tried.append(plan.batch_size)
        raise OutOfMemory("out of memory at step 1")
    with pytest.raises(OutOfMemory):
        train_stepping_down(request, Plan(batch_size=8), out_of_memory, lambda: 0, say)
    assert tried == [8, 4]
    line = capsys.readouterr().err.strip()
    assert line == ("--batch-size auto: micro-batch 8 ran out of memory in the first step; trying 4 "
                    "(x 1 accumulation) once")

    def only_8_too_big(plan):
        return plan.batch_size if plan.batch_size < 8 else out_of_memory(plan)
    assert train_stepping_down(request, Plan(batch_size=8), only_8_too_big, lambda: 0, say) == 4
    with pytest.raises(OutOfMemory):  # after a step has run, the OOM is not the batch size's
        train_stepping_down(request, Plan(batch_size=8), out_of_memory, lambda: 1, say)
    fault_log(kind="fault", case="--batch-size auto, out of memory in the first step", exit_code=3, message=line)


def test_train_plan_auto_on_tiny_llama_on_cpu_trains_the_chosen_plan(capsys, tmp_path):
    code = main(["train", "tiny-llama", "--plan", "auto", "--device", "cpu", "--seq-len", "32", "--global-batch", "4",
                 "--steps", "2", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0 and "--plan auto chose" in err and "--plan auto trains: trainwise train tiny-llama" in err


@pytest.mark.fault
def test_verify_of_a_gpu_that_is_not_here_is_refused_before_the_search(monkeypatch, capsys, fault_log):
    _use(monkeypatch, _never)
    line = _refused(capsys, [*PLAN, "--verify", "2"], "--verify")
    assert "H100-80GB is not present here" in line
    fault_log(kind="bad input", case="plan --verify 2 for an H100 on a machine without one", exit_code=2,
              message=line)


@pytest.mark.fault
def test_verify_without_plan_auto_in_train_is_refused(capsys, fault_log):
    line = _refused(capsys, ["train", "tiny-llama", "--device", "cpu", "--verify", "2"], "--verify")
    assert "--plan auto" in line
    fault_log(kind="bad input", case="train --verify 2 without --plan auto", exit_code=2, message=line)


def test_torchrun_workers_train_the_parents_choice_instead_of_searching_again():
    chosen = Plan(batch_size=2, grad_accum=4, grad_ckpt=True, precision="bf16", nproc=2, device="cpu")
    argv = ["train", "tiny-llama", "--plan", "auto", "--nproc", "2", "--global-batch", "16", "--steps", "3"]
    request = AutoRequest(plan=True, batch=False, global_batch=16, margin=0.05, fixed=frozenset({"nproc"}))
    pinned = pinned_argv(argv, chosen, request)
    assert "auto" not in pinned and pinned[:2] == ["train", "tiny-llama"]
    assert pinned[pinned.index("--batch-size") + 1] == "2" and pinned[pinned.index("--grad-accum") + 1] == "4"
    assert "--grad-ckpt" in pinned and pinned[pinned.index("--precision") + 1] == "bf16"
    assert "--device" not in pinned and pinned.count("--nproc") == 1  # the launcher strips its own --nproc
    batch_only = AutoRequest(plan=False, batch=True, global_batch=16, margin=0.05, fixed=frozenset())
    pinned = pinned_argv(["train", "m", "--plan", "my.yaml", "--batch-size=auto"], chosen, batch_only)
    assert pinned[:4] == ["train", "m", "--plan", "my.yaml"] and "--grad-ckpt" not in pinned
    assert pinned[pinned.index("--batch-size") + 1] == "2"


def test_train_plan_auto_without_a_global_batch_trains_eight_samples_per_step_per_gpu(capsys, tmp_path):
    # Left open, the search would take the largest micro-batch that fits (1,024 rows of tiny-llama
    # at 32 tokens on a CPU): seconds per step and more rows than a small dataset has.
    code = main(["train", "tiny-llama", "--plan", "auto", "--device", "cpu", "--seq-len", "32", "--steps", "1",
                 "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0 and "no --global-batch given: 8 samples per step (8 per GPU, the default" in err
    trains = next(line for line in err.splitlines() if line.startswith("--plan auto trains:")).split()
    batch = int(trains[trains.index("--batch-size") + 1]) if "--batch-size" in trains else 1
    accum = int(trains[trains.index("--grad-accum") + 1]) if "--grad-accum" in trains else 1
    assert batch * accum == 8


def test_plan_auto_over_nodes_searches_and_sizes_the_batch_for_every_gpu_of_the_job():
    # --nnodes 2 --nproc 4 is a job of 8 GPUs: the layout search and the default batch are for 8,
    # not for this node's 4 (decided without launching torchrun).
    from trainwise.api.auto_choice import search_scope

    request = AutoRequest(plan=True, batch=False, global_batch=None, margin=0.05, fixed=frozenset(), nnodes=2)
    scope = search_scope(request, nproc=4)
    assert (scope.gpus, scope.gpus_per_node, scope.global_batch) == (8, 4, 64)
    one_node = search_scope(AutoRequest(plan=True, batch=False, global_batch=None, margin=0.05,
                                        fixed=frozenset()), nproc=4)
    assert (one_node.gpus, one_node.gpus_per_node, one_node.global_batch) == (4, None, 32)
    given = search_scope(AutoRequest(plan=True, batch=False, global_batch=48, margin=0.05, fixed=frozenset(),
                                     nnodes=2), nproc=4)
    assert (given.gpus, given.global_batch, given.line) == (8, 48, None)


def test_plan_auto_over_nodes_hands_the_search_the_jobs_gpus_though_nproc_was_given(monkeypatch):
    # --nproc 4 is held fixed as this node's; the search over 8 GPUs must not refuse it.
    from trainwise.api.search_layouts import check_layout_request
    from trainwise.api.auto_choice import resolve_auto

    class Searched(Exception):
        pass

    def search(model, base, fixed, *, gpus, gpus_per_node, global_batch, **_):
        check_layout_request(gpus, gpus_per_node, global_batch, base, frozenset(fixed))
        raise Searched(gpus, gpus_per_node, global_batch, base.nproc)

    monkeypatch.setattr(search_api, "plan_search", search)
    request = AutoRequest(plan=True, batch=False, global_batch=None, margin=0.05, fixed=frozenset({"nproc"}),
                          nnodes=2)
    with pytest.raises(Searched) as searched:
        resolve_auto(request, Plan(device="cpu", nproc=4), "tiny-llama", "cpu", None, False, say=lambda line: None)
    assert searched.value.args == (8, 4, 64, 8)


def test_plan_auto_bounds_its_default_batch_by_the_rows_the_data_holds():
    from trainwise.api.auto_choice import search_scope
    from trainwise.common.errors import InputError

    def scope(rows, nproc=1):
        return search_scope(AutoRequest(plan=True, batch=False, global_batch=None, margin=0.05,
                                        fixed=frozenset(), rows=rows), nproc=nproc)

    assert scope(5).global_batch == 5 and "cut to 5" in scope(5).line
    assert scope(6, nproc=4).global_batch == 4  # one micro-batch row per rank, the same on every rank
    assert scope(60).global_batch == 8 and "cut" not in scope(60).line
    with pytest.raises(InputError) as refused:
        scope(3, nproc=4)
    assert refused.value.field == "--data"


def test_rows_at_least_counts_a_small_text_file_and_the_builtin_corpus_without_tokenizing(tmp_path):
    from trainwise.engine.data.row_count import rows_at_least

    text = tmp_path / "small.txt"
    text.write_text("".join("x" * 31 + "\n" for _ in range(60)))  # 60 lines of 31 bytes: 1,860 text bytes
    assert rows_at_least(str(text), None, None, 32) == 1860 // 32
    assert rows_at_least(str(text), "tok-dir", None, 32) is None  # a tokenizer's count needs the tokenizing
    assert rows_at_least("synthetic", None, None, 32) is None
    assert rows_at_least("builtin", None, None, 64) > 10_000


@pytest.mark.slow
def test_train_plan_auto_on_a_dataset_smaller_than_the_default_batch_trains(capsys, tmp_path):
    # 5 sequences of 32 byte tokens: the default 8 samples per step would be refused after the search.
    text = tmp_path / "five.txt"
    text.write_text("".join("y" * 39 + "\n" for _ in range(5)))
    code = main(["train", "tiny-llama", "--plan", "auto", "--device", "cpu", "--seq-len", "32", "--steps", "1",
                 "--data", str(text), "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "cut to 6 because --data holds at least 6 sequences" in err


def _liger_faster(plan):
    """The formula, with Liger's kernels 20 % faster: the winner on a GPU needs liger-kernel."""
    measure = formula(plan)
    if plan.kernels != "liger":
        return measure
    breakdown = {k: v * 0.8 for k, v in measure.breakdown.items()}
    return Measure(memory_bytes=measure.memory_bytes, step_s=sum(breakdown.values()), breakdown=breakdown,
                   ideal_s=measure.ideal_s)


def _nothing_installed(monkeypatch):
    from trainwise.hardware import installation
    from trainwise.search import refine, space

    for module in (installation, refine, space):
        monkeypatch.setattr(module, "installed", lambda package: False)


def test_a_plan_for_a_catalog_gpu_says_which_packages_it_needs_that_are_not_installed_here(monkeypatch, capsys):
    _use(monkeypatch, _liger_faster)
    _nothing_installed(monkeypatch)
    assert main(PLAN + ["--global-batch", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    best = data["plans"][0]
    assert not data["installed_only"] and best["plan"]["kernels"] == "liger"  # the cluster may have it
    assert {"flag": "--kernels liger", "module": "liger_kernel", "pip": "liger-kernel>=0.6,<0.9"} \
        in best["not_installed_here"]
    assert main(PLAN + ["--global-batch", "16"]) == 0
    assert "--kernels liger needs liger-kernel (not installed here: pip install 'liger-kernel>=0.6,<0.9')" \
        in capsys.readouterr().out


def test_installed_only_keeps_the_search_to_installed_packages_and_is_the_default_for_this_machine(monkeypatch,
                                                                                                 capsys):
    _use(monkeypatch, _liger_faster)
    _nothing_installed(monkeypatch)
    assert main(PLAN + ["--global-batch", "16", "--installed-only", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["installed_only"] and all(p["not_installed_here"] == [] for p in data["plans"])
    assert all(p["plan"]["kernels"] == "none" and not p["plan"]["compile"] for p in data["plans"])
    assert any("Liger kernels not searched: needs liger-kernel" in note for note in data["notes"])
    cpu = ["plan", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--precision", "bf16", "--global-batch", "8"]
    assert main(cpu + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["installed_only"]  # the CPU is this machine's
    assert main(cpu + ["--no-installed-only", "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["installed_only"]


def test_the_install_lines_ask_for_the_versions_of_the_gpu_extra():
    import tomllib
    from pathlib import Path

    from trainwise.hardware.installation import BITSANDBYTES, LIGER, TORCHAO

    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    assert {LIGER.pip, TORCHAO.pip, BITSANDBYTES.pip} <= set(extra)


def test_a_global_batch_given_beyond_the_datas_rows_searches_micro_batches_the_data_can_fill(monkeypatch):
    # --global-batch 16 on 6 sequences: micro-batch 16 would be refused by the data after the search.
    from trainwise.api.search import plan_search

    report = plan_search("tiny-llama", Plan(device="H100", seq_len=64), {"seq_len", "device"}, global_batch=16,
                         evaluator=formula, rows=6)
    assert {mb for mb, _ in report.space.batches} == {1, 2, 4}
    assert all(c.plan.batch_size <= 6 for c in report.result.ranked)


def test_the_search_estimates_with_the_imports_objects_out_of_the_collectors_walks():
    # Every estimate of a search traces, and each trace makes objects enough for thousands of
    # collections: the objects made before it (the imports') are frozen and full collections
    # are rarer while it runs (common/frozen_heap.py); both are undone after it.
    import gc

    from trainwise.api.search import plan_search
    from trainwise.common.frozen_heap import FULL_COLLECTION_EVERY

    seen = []

    def evaluator(plan):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[2]))
        return formula(plan)
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    plan_search("tiny-llama", Plan(device="H100", seq_len=64), {"seq_len", "device"}, global_batch=16,
                evaluator=evaluator)
    assert seen and min(f for f, _ in seen) > 10_000  # torch's and transformers' modules, classes, functions
    assert {t for _, t in seen} == {max(before[2], FULL_COLLECTION_EVERY)}
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
