"""bench measures honestly: each row's median and spread, every run kept, and the ratio to
the Trainer printed only when both rows were steady on a quiet machine, else the reason.

The rows' timings are injected (run_row replaced by synthetic runs), so these tests check
what bench does with timings, not the timings of this machine."""

import csv
import json
import re

import pytest

from trainwise.api import benchmark
from trainwise.bench.repeats import combine_runs
from trainwise.bench.rows import row_from_summary, row_plan
from trainwise.cli.main import main
from trainwise.common import noise

RATIO = r"(?<!above )\d+\.\d\dx"  # a printed ratio (the legend's "above 1.00x" is not one)
STEADY = [0.100, 0.101, 0.099, 0.100, 0.102, 0.100]  # seconds per step: under 3 % apart
NOISY = [0.100, 0.180, 0.095, 0.240, 0.101, 0.150]  # a busy neighbour came and went


@pytest.fixture
def timings(monkeypatch, tmp_path):
    """Each engine's rows "run" with the step times set in the returned dict (engine ->
    list of per-run step-time lists, used in turn); records how often each engine ran."""
    plan = {"trainwise": [STEADY], "hf-trainer": [[t * 1.25 for t in STEADY]], "calls": []}

    def fake_run_row(job, predicted=None):
        runs = plan[job.engine]
        steps = runs[sum(1 for c in plan["calls"] if c == job.engine) % len(runs)]
        plan["calls"].append(job.engine)
        samples = job.plan.batch_size * job.plan.grad_accum
        per_step = sum(steps) / len(steps)
        summary = {"time_s": sum(steps), "samples_per_s": samples / per_step, "tokens_per_s": samples * 32 / per_step,
                   "mfu": None, "peak_allocated": 1000, "memory_method": "injected", "step_times_s": steps}
        return row_from_summary(job.name, row_plan(job.plan), job.engine, summary, predicted)

    monkeypatch.setattr(benchmark, "run_row", fake_run_row)
    monkeypatch.setattr(benchmark, "_predicted", lambda model, plan, task: ({"peak_allocated": 1000}, None))
    monkeypatch.setattr(noise.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(noise._OWN_LOAD, "now", lambda: 0.0)
    quiet(monkeypatch)
    return plan


def quiet(monkeypatch, load=0.1):
    """Other processes use `load` CPUs (as measured before each run), whatever this machine does."""
    monkeypatch.setattr(noise, "_others_now", lambda window_s: load)


def _bench_cli(tmp_path, capsys, *extra):
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text("- {name: vanilla, plan: {batch_size: 2}}\n")
    code = main(["bench", "tiny-llama", "--ladder", str(ladder), "--steps", "8", "--device", "cpu",
                 "--seq-len", "32", "--out", str(tmp_path / "out"), *extra])
    assert code == 0
    text = capsys.readouterr().out
    return " ".join(text.split()), json.loads((tmp_path / "out" / "results.json").read_text())


def test_steady_rows_on_a_quiet_machine_show_the_ratio_of_medians(tmp_path, capsys, timings):
    text, rows = _bench_cli(tmp_path, capsys)
    assert re.findall(RATIO, text) == ["1.25x"] and "not shown" not in text
    assert rows[0]["vs_baseline"] == {"ratio": 1.25, "withheld": None}
    assert rows[0]["spread"]["over"] == "steps" and rows[0]["spread"]["n"] == len(STEADY)
    assert rows[0]["spread"]["spread_pct"] < 3 and rows[0]["busy"] is None


def test_a_busy_machine_prints_no_ratio_and_says_why(tmp_path, capsys, timings, monkeypatch):
    quiet(monkeypatch, load=5.2)
    text, rows = _bench_cli(tmp_path, capsys)
    assert not re.search(RATIO, text)
    assert "vs HF Trainer not shown: machine busy: other processes used 5.2 of 2 CPUs" in text
    assert rows[0]["vs_baseline"]["ratio"] is None and "used 5.2" in rows[0]["vs_baseline"]["withheld"]
    assert rows[0]["busy"].startswith("machine busy") and rows[1]["busy"].startswith("machine busy")
    assert "machine busy: other processes used 5.2" in (tmp_path / "out" / "results.md").read_text()
    table = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert table[0]["vs_baseline_ratio"] == "" and table[0]["vs_baseline_withheld"].startswith("machine busy")


def test_a_spread_over_10_percent_prints_no_ratio_and_says_how_much(tmp_path, capsys, timings):
    timings["hf-trainer"] = [NOISY]
    text, rows = _bench_cli(tmp_path, capsys)
    assert not re.search(RATIO, text)
    spread = rows[1]["spread"]["spread_pct"]
    assert spread > 10
    assert f"vs HF Trainer not shown: spread {spread:.0f} % > 10 %" in text
    assert f"not shown: spread {spread:.0f} % > 10 %" in (tmp_path / "out" / "results.md").read_text()


def test_repeat_runs_each_row_again_and_keeps_every_run(tmp_path, capsys, timings):
    timings["trainwise"] = [STEADY, [t * 2 for t in STEADY], [t * 1.02 for t in STEADY]]
    text, rows = _bench_cli(tmp_path, capsys, "--repeat", "3")
    assert timings["calls"].count("trainwise") == 3 and timings["calls"].count("hf-trainer") == 3
    mine = rows[0]
    assert mine["spread"]["over"] == "runs" and len(mine["runs"]) == 3
    assert [len(run["step_times_s"]) for run in mine["runs"]] == [len(STEADY)] * 3
    speeds = sorted(run["samples_per_s"] for run in mine["runs"])
    assert mine["samples_per_s"] == pytest.approx(speeds[1])  # the median run, not the mean
    assert mine["vs_baseline"]["ratio"] is None and "spread" in mine["vs_baseline"]["withheld"]


def test_one_run_with_step_times_keeps_its_rates_consistent():
    steps = [0.1, 0.2, 0.1, 0.1]
    row = {"status": "ok", "samples_per_s": 4 / 0.125, "tokens_per_s": 128 / 0.125, "mfu": 0.5, "time_s": 0.5,
           "step_times_s": steps}
    combined = combine_runs([row], busy=None)
    assert combined["samples_per_s"] == pytest.approx(40.0)  # 4 samples / the median step of 0.1 s
    assert combined["tokens_per_s"] == pytest.approx(1280.0) and combined["mfu"] == pytest.approx(0.625)
    assert combined["runs"][0]["step_times_s"] == steps and "step_times_s" not in combined


def test_a_gpu_run_timed_in_windows_gives_one_sample_per_window_not_one_per_step():
    # A GPU run reads the device every 10 steps (bench/runner.py): its timed steps carry
    # their window's mean, so 9 + 10 equal step times are two measurements, not 19.
    windows = [0.100] * 9 + [0.104] * 10
    row = {"status": "ok", "samples_per_s": 2 / 0.102, "tokens_per_s": 64 / 0.102, "mfu": None, "time_s": 2.0,
           "step_times_s": windows}
    combined = combine_runs([row], busy=None)
    assert combined["spread"]["n"] == 2 and combined["spread"]["over"] == "steps"
    one_window = combine_runs([{**row, "step_times_s": [0.1] * 9}], busy=None)
    assert one_window["spread"]["n"] == 1  # nothing to judge a ratio by (noise.confident_ratio)
    assert noise.confident_ratio(noise.Spread.of(one_window["spread"]["samples"]),
                                 noise.Spread.of([1.0, 1.01])).withheld == "one sample: no spread to judge it by"


@pytest.mark.fault
@pytest.mark.parametrize("repeat", ["0", "-1"])
def test_a_repeat_below_one_is_exit_2(tmp_path, repeat, capsys, fault_log):
    code = main(["bench", "tiny-llama", "--ladder", "quick", "--device", "cpu", "--repeat", repeat,
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "trainwise: error: --repeat: must be an int >= 1" in err
    assert not (tmp_path / "out").exists()  # refused before any row ran
    fault_log(kind="bad input", case=f"bench --repeat {repeat}", exit_code=code, message=err.strip())


def _benchmarks_on_path():
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parent.parent / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def test_vs_hf_trainer_withholds_the_ratio_on_a_busy_machine_and_exits_1(tmp_path, capsys, timings, monkeypatch):
    _benchmarks_on_path()
    import vs_hf_trainer

    monkeypatch.setattr(vs_hf_trainer, "run_row", benchmark.run_row)  # the injected timings
    quiet(monkeypatch, load=5.2)
    code = vs_hf_trainer.main(["--steps", "8", "--repeats", "2", "--seq-len", "32"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and result["samples_per_s_ratio"] is None
    assert result["ratio_withheld"].startswith("machine busy: other processes used 5.2 of 2 CPUs")
    quiet(monkeypatch)
    assert vs_hf_trainer.main(["--steps", "8", "--repeats", "2", "--seq-len", "32"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["samples_per_s_ratio"] == 1.25 and result["samples_per_s_spread"]["trainwise"]["n"] == 2
    assert result["samples_per_s_ratio_paired"] == 1.25 and len(result["paired_ratios"]) == 2


def test_bench_page_and_scaling_pages_say_when_the_machine_was_busy():
    _benchmarks_on_path()
    import bench_page
    import scaling

    busy = "machine busy: load 3.1 on 2 CPUs, about 2.0 of it from other processes"
    rows = [{"name": "a", "engine": "trainwise", "busy": busy}, {"name": "a", "engine": "hf-trainer", "busy": None}]
    assert bench_page.busy_line(rows).startswith(f"Machine: busy when 1 of 2 rows ran ({busy})")
    assert bench_page.busy_line([{**r, "busy": None} for r in rows]).startswith("Machine: quiet")
    assert scaling._spread({"repeats_seconds_per_step": [1.0, 1.02, 1.01], "busy": None}) == "2 %"
    assert scaling._spread({"repeats_seconds_per_step": [1.0, 1.02, 1.01], "busy": busy}) == "2 % (noisy)"
    assert scaling._spread({"repeats_seconds_per_step": [1.0, 1.5, 1.01], "busy": None}) == "50 % (noisy)"


def test_vs_hf_trainer_pairs_neighbouring_runs_so_a_machine_whose_speed_moves_still_gives_a_ratio():
    """Each engine's runs spread 50 % as the machine's speed moves between pairs, so the
    ratio of medians is withheld; the two runs of a pair share their moment, and their
    ratios agree."""
    _benchmarks_on_path()
    import vs_hf_trainer

    speed = [1.0, 1.5, 1.2, 0.9]  # the machine's speed at each pair
    trainwise_runs = [{"samples_per_s": 110.0 * s} for s in speed]
    trainer_runs = [{"samples_per_s": 100.0 * s * f} for s, f in zip(speed, (1.0, 1.02, 0.99, 1.0))]
    ratio, pairs = vs_hf_trainer.paired_ratio(trainwise_runs, trainer_runs)
    assert ratio.withheld is None and ratio.value == pytest.approx(1.1, rel=0.02) and len(pairs) == 4
    medians = noise.confident_ratio(noise.Spread.of(r["samples_per_s"] for r in trainwise_runs),
                                    noise.Spread.of(r["samples_per_s"] for r in trainer_runs))
    assert medians.value is None and "spread" in medians.withheld
    # Pairs that disagree past 10 %, a failed run, a busy machine: withheld, and said why.
    trainer_runs[1]["samples_per_s"] *= 1.3
    assert "the pairs' ratios spread" in vs_hf_trainer.paired_ratio(trainwise_runs, trainer_runs)[0].withheld
    assert vs_hf_trainer.paired_ratio(trainwise_runs[:1], trainer_runs[:1])[0].withheld.startswith("fewer than two")
    assert vs_hf_trainer.paired_ratio(trainwise_runs, trainer_runs, busy="machine busy")[0].withheld == "machine busy"
    failed = [{"samples_per_s": None}, *trainwise_runs[1:]]
    assert len(vs_hf_trainer.paired_ratio(failed, trainer_runs)[1]) == 3
