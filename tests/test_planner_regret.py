"""benchmarks/planner_regret.py: the groups it measures, the regret, Spearman and misordered
pairs its page reports, and the page rendered from its rows file."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import planner_regret  # noqa: E402
import provenance  # noqa: E402
import render_planner_regret  # noqa: E402
import steady_calibration  # noqa: E402


def test_the_groups_span_eight_searches_and_four_families_with_an_encoder_and_an_encoder_decoder():
    from trainwise.models import resolve_model

    specs = {g["model"]: resolve_model(g["model"]) for g in planner_regret.GROUPS}
    assert len({planner_regret.group_name(g) for g in planner_regret.GROUPS}) >= 8
    assert len({s.family for s in specs.values()}) >= 4 and all(s.tiny for s in specs.values())
    tasks = {s.task for s in specs.values()}
    assert "seq-cls" in tasks and "seq2seq" in tasks  # BERT-like and T5-like


def test_an_unknown_group_is_refused_naming_the_closest(capsys):
    with pytest.raises(SystemExit) as exit_:
        planner_regret.parse_args(["--groups", "tiny-bert/s64/gb5"])
    assert exit_.value.code == 2
    assert "did you mean tiny-bert/s64/gb4?" in capsys.readouterr().err


def _plan(role: str, predicted: float, repeats: list[float], label: str = "") -> dict:
    return {"role": role, "plan": {}, "label": label, "predicted_s": predicted, "exact": role != "drawn",
            "changes_math": [], "notes": [], "repeats_s": repeats, "errors": []}


def _group(name: str, plans: list[dict]) -> dict:
    return {"name": name, "model": name.split("/")[0], "seq_len": 64, "global_batch": 8, "kept_fitting": 20,
            "search_s": 3.0, "plans": plans}


def test_regret_is_the_pick_over_the_fastest_measured_and_the_noise_and_misorders_are_named():
    group = _group("m/s64/gb8", [_plan("pick", 1.0, [1.10, 1.12, 1.08]), _plan("confirmed", 1.2, [1.0, 1.0, 1.0]),
                                 _plan("drawn", 3.0, [3.0, 3.3, 2.7])])
    found = render_planner_regret.group_summary(group)
    assert found["regret"] == pytest.approx(0.10) and found["best"] == 2
    assert found["noise"] == pytest.approx(0.04 / 1.10)
    assert found["misordered"] == [{"faster_predicted": 1, "faster_measured": 2, "gap": pytest.approx(0.10),
                                    "beyond_noise": True}]
    assert found["spearman"] == pytest.approx(0.5)


def test_the_page_is_rendered_from_the_rows_and_says_which_targets_were_missed(tmp_path):
    prov = {"command": "python benchmarks/planner_regret.py", "commit": "c" * 40 + " (clean tree)",
            "device": "CPU Test, 2 cores", "versions": "python 3, torch 2, transformers 5, trainwise 0.1.0",
            "date": "2026-01-01 00:00 UTC", "load_start": 0.1, "load_end": 0.2, "cores": 2}
    close = _group("a/s64/gb8", [_plan("pick", 1.0, [1.0, 1.01]), _plan("confirmed", 2.0, [2.0, 2.02]),
                                 _plan("drawn", 3.0, [3.0, 3.0])])
    off = _group("b/s64/gb8", [_plan("pick", 1.0, [2.0, 2.0], "batch_size=8"), _plan("confirmed", 2.0, [1.0, 1.0]),
                               _plan("drawn", 3.0, [3.0, 3.0])])
    launch = {"provenance": prov, "device_kind": "cpu", "minutes": 1.0, "groups": [close, off],
              "profile": {"how": "a test profile", "warnings": [], "calibration_s": None},
              "settings": {"top": 2, "random": 1, "seed": 0, "repeats": 2, "steps": 6, "warmup": 2}}
    rows, out = tmp_path / "rows.json", tmp_path / "page.md"
    rows.write_text(json.dumps({"launches": [launch]}))

    assert render_planner_regret.main([str(rows), "--out", str(out)]) == 0

    text = out.read_text()
    found = provenance.parse(text)
    assert found["command"].startswith("`python benchmarks/render_planner_regret.py")
    assert "`python benchmarks/planner_regret.py`" in found["measured by"] and found["device profile"] == "a test profile"
    assert "**MISSED:" in text and "median regret 50.0 %, max 100.0 % (of medians: these rows have no paired" in text
    assert "| b/s64/gb8 | 1: batch_size=8 | 2 | - | - | 2 | 100.0 % | 0.0 % | 0.50 | 1 / 1 |" in text
    assert "| a/s64/gb8 | 1: defaults | 2 | - | - | 1 | 0.0 % (inside the noise) |" in text


def test_the_paired_regret_reads_each_rounds_two_runs_together_and_is_the_headline():
    """Runs of one round are taken close together, so a slow spell stretches both: the
    regret is the median over the rounds of pick / rival, each run paired with its round's."""
    pick = _plan("pick", 1.0, [1.0, 1.5, 1.5, 1.01])
    rival = _plan("confirmed", 1.1, [1.02, 1.02, 1.45, 1.45, 1.45])
    pick["rounds"], rival["rounds"] = [0, 1, 3, 4], [0, 1, 2, 3, 4]  # the pick's run of round 2 failed
    group = _group("m/s64/gb8", [pick, rival, _plan("drawn", 3.0, [3.0, 3.0, 3.0])])
    ratios = [1.0 / 1.02, 1.5 / 1.02, 1.5 / 1.45, 1.01 / 1.45]
    assert render_planner_regret.paired_ratios(pick, rival) == pytest.approx(ratios)
    found = render_planner_regret.group_summary(group)
    assert found["rival"] == 2 and found["regret"] == pytest.approx(0.0)  # medians 1.255 against 1.45
    assert found["paired_regret"] == pytest.approx(statistics.median(ratios) - 1)
    assert render_planner_regret._paired(found).endswith("(inside the noise)")  # the pick won two rounds

    # Faster in every round: no regret, whatever the rounds' speeds.
    rival["rounds"] = pick["rounds"] = [0, 1, 2, 3]
    rival["repeats_s"] = [1.05 * s for s in pick["repeats_s"]]
    assert render_planner_regret.group_summary(group)["paired_regret"] == 0.0
    summary = render_planner_regret.summarize([group])
    assert summary["judged_paired"] and summary["median_paired_regret"] == 0.0 and summary["met"]

    # Slower in every round: beyond the noise, and the targets are judged on it.
    rival["repeats_s"] = [0.8 * s for s in pick["repeats_s"]]
    found = render_planner_regret.group_summary(group)
    assert found["paired_regret"] == pytest.approx(0.25) and "noise" not in render_planner_regret._paired(found)
    summary = render_planner_regret.summarize([group])
    assert summary["max_paired_regret"] == pytest.approx(0.25) and not summary["met"]


def test_each_plan_is_run_by_trainwise_train_at_default_threads_and_timed_in_wall_seconds(tmp_path, monkeypatch):
    """measure() drives time_model's fresh-process runner: the command it builds, the
    environment of the default case (no OMP_NUM_THREADS added), the wall seconds kept."""
    import argparse
    import types

    import time_model

    calls = []

    def fake_run(argv, env=None, **kwargs):
        calls.append((argv, env))
        metrics = Path(argv[argv.index("--metrics") + 1])
        steps = [{"step": i, "step_time_s": 0.5, "step_cpu_s": 0.9} for i in range(1, 6)]
        metrics.write_text("".join(json.dumps(s) + "\n" for s in steps))
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(time_model.subprocess, "run", fake_run)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    from trainwise.plan.plan import Plan

    plan = {"plan": Plan(device="cpu", seq_len=32).to_dict(), "predicted_s": 0.5, "repeats_s": [], "errors": []}
    groups = [{"name": "tiny-llama/s32/gb2", "model": "tiny-llama", "plans": [plan]}]
    args = argparse.Namespace(steps=5, warmup=1, repeats=2, timed_seconds=0.0)
    planner_regret.measure(groups, args, tmp_path)
    assert plan["errors"] == [] and plan["repeats_s"] == [0.5, 0.5]  # wall seconds, not CPU
    assert plan["rounds"] == [0, 1]  # each run's round, to pair it with another plan's
    assert all("train" in argv and "OMP_NUM_THREADS" not in env for argv, env in calls) and len(calls) == 2
    assert all(argv[argv.index("--steps") + 1] == "5" for argv, _ in calls)


def test_a_fast_plan_times_enough_steps_to_fill_the_timed_seconds_and_a_slow_one_keeps_steps(tmp_path, monkeypatch):
    """A 10 ms step timed 3 times is one scheduler hiccup from a 50 % spread: a run takes
    --timed-seconds of timed steps at the plan's predicted time (capped), besides the warm-up
    and the memory-profiled last step; a plan slower than that keeps --steps."""
    import argparse
    import types

    import time_model

    steps_asked = {}

    def fake_run(argv, env=None, **kwargs):
        steps = int(argv[argv.index("--steps") + 1])
        steps_asked[argv[argv.index("--plan") + 1]] = steps
        metrics = Path(argv[argv.index("--metrics") + 1])
        metrics.write_text("".join(json.dumps({"step": i, "step_time_s": 0.01}) + "\n" for i in range(1, steps + 1)))
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(time_model.subprocess, "run", fake_run)
    from trainwise.plan.plan import Plan

    fast = {"plan": Plan(device="cpu", seq_len=32).to_dict(), "predicted_s": 0.01, "repeats_s": [], "errors": []}
    slow = {"plan": Plan(device="cpu", seq_len=64).to_dict(), "predicted_s": 2.0, "repeats_s": [], "errors": []}
    tiny = {"plan": Plan(device="cpu", seq_len=16).to_dict(), "predicted_s": 1e-6, "repeats_s": [], "errors": []}
    groups = [{"name": "tiny-llama/s32/gb2", "model": "tiny-llama", "plans": [fast, slow, tiny]}]
    planner_regret.measure(groups, argparse.Namespace(steps=5, warmup=1, repeats=1, timed_seconds=1.5), tmp_path)
    assert (fast["steps"], slow["steps"], tiny["steps"]) == (1 + 150 + 1, 5, 1 + time_model.MAX_TIMED_STEPS + 1)
    assert sorted(steps_asked.values()) == sorted([152, 5, 2 + time_model.MAX_TIMED_STEPS])


def test_every_group_settles_its_pick_and_the_fastest_other_plan_with_alternate_runs(tmp_path, monkeypatch):
    """A regret read from 3 runs per plan on a machine whose runs spread by half can be all
    noise: --settle adds runs of the two plans the regret turns on, alternately, in every
    group (the pick's closest rival when the pick was fastest, so the runs do not only ever
    help the pick), and the regret is read from all of them."""
    import argparse

    import time_model

    slow_pick = _group("a/s64/gb8", [_plan("pick", 1.0, [1.3, 1.3, 1.3]), _plan("confirmed", 1.2, [1.5, 1.5, 1.5]),
                                     _plan("drawn", 3.0, [1.0, 1.0, 1.0])])
    fast_pick = _group("b/s64/gb8", [_plan("pick", 1.0, [1.0, 1.0, 1.0]), _plan("confirmed", 1.2, [2.0, 2.0, 2.0]),
                                     _plan("drawn", 3.0, [1.4, 1.4, 1.4])])
    for group in (slow_pick, fast_pick):
        for plan in group["plans"]:
            plan.update(plan={}, steps=5)
    assert planner_regret.contenders(slow_pick) == (0, 2) and planner_regret.contenders(fast_pick) == (0, 2)

    order = []

    def fake_measure_once(row, runner, workdir, index):
        order.append(row["name"])
        return 0.1, 1.0  # every settling run of either plan: 1.0 s

    monkeypatch.setattr(time_model, "measure_once", fake_measure_once)
    import trainwise.plan.plan as plan_module

    monkeypatch.setattr(plan_module.Plan, "from_dict", staticmethod(lambda d: d))
    planner_regret.settle([slow_pick, fast_pick], argparse.Namespace(settle=3, repeats=3, steps=5, warmup=1,
                                                                     timed_seconds=0.0), tmp_path)
    # Back-to-back pairs, the order swapped every pair.
    assert order == (["a/s64/gb8 0", "a/s64/gb8 2", "a/s64/gb8 2", "a/s64/gb8 0", "a/s64/gb8 0", "a/s64/gb8 2"]
                     + ["b/s64/gb8 0", "b/s64/gb8 2", "b/s64/gb8 2", "b/s64/gb8 0", "b/s64/gb8 0", "b/s64/gb8 2"])
    assert slow_pick["plans"][0]["rounds"] == slow_pick["plans"][2]["rounds"] == [3, 4, 5]
    assert slow_pick["plans"][0]["repeats_s"] == [1.3] * 3 + [1.0] * 3 and slow_pick["plans"][1]["repeats_s"] == [1.5] * 3
    assert slow_pick["plans"][0]["settle_runs"] == 3 and "settle_runs" not in slow_pick["plans"][1]
    # The pick's median is now (1.0 + 1.3) / 2 against 1.0: the regret reads all six runs.
    assert render_planner_regret.group_summary(slow_pick)["regret"] == pytest.approx(0.15)
    assert planner_regret.settle([slow_pick], argparse.Namespace(settle=0), tmp_path) is None and len(order) == 12


@pytest.mark.parametrize("moved, tries", [([], 1), ([1.3], 2), ([0.8, 1.2], 3), ([1.3, 1.3, 1.3], 3)])
def test_a_calibration_during_which_the_speed_moved_is_run_again_up_to_three_times_and_every_try_is_recorded(
        tmp_path, monkeypatch, moved, tries):
    import argparse
    import types

    from trainwise.api import calibrate as calibrate_module

    calls = []

    def fake_calibrate(device, quick=False):
        calls.append(device)
        ratio = moved[len(calls) - 1] if len(calls) <= len(moved) else 1.02
        # Noisy repeats on every try (as on this VM): not a reason to calibrate again.
        measured = {"cpu_count": 2, "spread": {"memory": 0.5}, "steadiness": {"ratio": ratio}}
        return types.SimpleNamespace(warnings=tuple(calibrate_module.busy_warnings(measured)),
                                     profile=types.SimpleNamespace(measured=measured))

    monkeypatch.setattr(calibrate_module, "calibrate", fake_calibrate)
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    found = planner_regret.profile_in_fresh_cache(argparse.Namespace(profile=None, quick=True), tmp_path)
    assert len(calls) == tries == len(found["attempts"])
    assert found["warnings"] == found["attempts"][-1]["warnings"]
    assert found["attempts"][-1]["unsteady"] == (len(moved) >= planner_regret.CALIBRATION_TRIES)
    assert all("repeats spread" in a["warnings"][0] for a in found["attempts"])
    assert (f"the last of {tries} tries" in found["how"]) == (tries > 1)

    page = steady_calibration.tries_lines(found["attempts"])
    assert len(page) == (0 if tries == 1 else tries + 3)
    if tries > 1:
        assert "speed changed while calibrating" in page[2] and page[2].startswith("- try 1 (")
