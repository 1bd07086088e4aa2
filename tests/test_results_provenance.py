"""Results pages cannot drift: every page in docs/results/ names the command that writes
it (a script in benchmarks/), the commit, the device and the versions; the memory page
is rendered from rows files, launches merged by a script."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import provenance  # noqa: E402
import render_memory  # noqa: E402

PAGES = sorted((REPO / "docs" / "results").glob("*.md"))
GiB = 1024**3


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_results_page_names_its_command_commit_device_and_versions(page):
    found = provenance.parse(page.read_text())
    missing = [key for key in provenance.REQUIRED_KEYS if key not in found]
    assert not missing, f"{page.name}: no {', '.join(missing)} in its ## Provenance section"
    command = re.match(r"`((?:python|bash) (benchmarks/\S+)[^`]*)`", found["command"])
    assert command, f"{page.name}: the command must run a script in benchmarks/, got {found['command']}"
    assert (REPO / command.group(2)).is_file(), f"{page.name}: {command.group(2)} does not exist"
    assert re.search(r"\b[0-9a-f]{7,40}\b", found["commit"]), f"{page.name}: no commit hash"
    versions = found["versions"].lower()
    assert all(name in versions for name in provenance.VERSION_NAMES), f"{page.name}: versions {versions}"


def _launch(path: Path, commit: str, rows: list[dict]) -> Path:
    prov = {"command": "python benchmarks/validate_memory.py", "commit": f"{commit} (clean tree)",
            "device": "GPU Test GPU (80.00 GiB) x 1", "versions": "python 3, torch 2, transformers 5, trainwise 0.1.0",
            "date": "2026-01-01 00:00 UTC", "load_start": 0.1, "load_end": 0.2, "cores": 16}
    path.write_text(json.dumps({"provenance": prov, "meta": {"gpu": "Test GPU"}, "rows": rows}))
    return path


def _row(name: str, predicted_gib: float, measured_gib: float | None) -> dict:
    measured = ({"status": "ok", "peak_allocated": int(measured_gib * GiB)} if measured_gib
                else {"status": "skipped", "reason": "needs bitsandbytes"})
    predicted = {"status": "ok", "peak_allocated": int(predicted_gib * GiB)}
    return {"name": name, "model": "tiny", "task": "causal-lm", "knobs": {"batch_size": 1},
            "predicted": predicted, "measured": measured,
            "error_pct": {"peak_allocated": render_memory.error_pct(predicted["peak_allocated"],
                                                                    measured.get("peak_allocated"))}}


def test_render_memory_merges_launches_and_a_later_row_replaces_an_earlier_one(tmp_path):
    first = _launch(tmp_path / "one.json", "a" * 40, [_row("a", 2.0, 1.0), _row("b", 1.0, 1.0)])
    second = _launch(tmp_path / "two.json", "b" * 40, [_row("a", 1.0, 1.0), _row("c", 1.0, None)])
    out = tmp_path / "memory.md"

    assert render_memory.main([str(first), str(second), "--out", str(out)]) == 0

    text = out.read_text()
    table = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 2 |" in table["a"] and "+0.0 %" in table["a"]  # the re-run after a fix wins
    assert "| 1 |" in table["b"]
    assert "skipped: needs bitsandbytes" in table["c"]
    assert "2 of 3 configurations measured." in text
    found = provenance.parse(text)
    assert found["command"].startswith("`python benchmarks/render_memory.py")
    assert "a" * 40 in found["commit"] and "b" * 40 in found["commit"]
    assert "one.json" in found["launch 1"] and "two.json" in found["launch 2"]


@pytest.mark.fault
def test_render_memory_refuses_a_file_that_is_not_a_rows_file_and_keeps_the_page(tmp_path, capsys, fault_log):
    bad = tmp_path / "rows.json"
    bad.write_text(json.dumps([{"name": "a"}]))
    page = tmp_path / "memory.md"
    page.write_text("# the page as it was\n")
    fault_log.watch(tmp_path)

    code = render_memory.main([str(bad), "--out", str(page)])

    message = capsys.readouterr().err.strip()
    assert code == 2 and message.startswith("render_memory.py: error: ") and "not a rows file" in message
    assert page.read_text() == "# the page as it was\n"
    fault_log(kind="bad input", case="render_memory.py given a JSON list instead of a validate_memory rows file",
              exit_code=code, message=message.replace(str(tmp_path), "DIR"))


def _vs_launch(steps: int, speeds: dict, finished: bool) -> dict:
    prov = {"command": "python benchmarks/vs_hf_trainer.py", "commit": "c" * 40 + " (clean tree)",
            "device": "CPU Test, 2 cores", "versions": "python 3, torch 2, transformers 5, trainwise 0.1.0",
            "date": "2026-01-01 00:00 UTC", "load_start": 3.0, "load_end": 3.5, "cores": 2}
    runs = [{"engine": e, "status": "ok", "samples_per_s": s, "peak_allocated": 1024**2}
            for e, values in speeds.items() for s in values]
    launch = {"case": "cpu", "model": "tiny-llama", "plan": {"batch_size": 8}, "steps": steps, "runs": runs,
              "provenance": prov}
    if finished:
        launch["result"] = {"samples_per_s_ratio": 1.25, "peak_memory_ratio": 1.0,
                            "peak_allocated_bytes": {"trainwise": 1024**2}, "mfu": {}}
    return launch


def test_render_vs_trainer_keeps_the_last_launch_of_a_case_and_shows_no_ratio_for_a_cut_one(tmp_path):
    import render_vs_trainer

    rows = tmp_path / "vs.json"
    rows.write_text(json.dumps({"launches": [
        _vs_launch(30, {"trainwise": [1.0], "hf-trainer": [1.0]}, True),
        _vs_launch(30, {"trainwise": [10.0, 12.0, 11.0], "hf-trainer": [8.0, 9.0, 10.0]}, True),
        _vs_launch(40, {"trainwise": [5.0], "hf-trainer": []}, False)]}))
    out = tmp_path / "vs.md"

    assert render_vs_trainer.main([str(rows), "--out", str(out)]) == 0

    text = out.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "launch" not in line]
    assert len(table) == 2
    assert "| 11.0 | 10.0, 12.0, 11.0 | 18 % | 9.0 |" in table[0] and "| 1.250 |" in table[0]
    assert "| n/a | n/a | 1.250 |" in table[0]  # measured before the pairing: no paired ratio
    assert "No ratio for launch 2" in text
    assert "busy" in provenance.parse(text)["launch 1"]


def test_validate_memory_writes_its_rows_after_every_row_and_renders_the_page_from_them(tmp_path, monkeypatch):
    import torch
    import validate_memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(provenance, "device_description", lambda: "GPU Test GPU (80.00 GiB) x 1")
    monkeypatch.setattr(validate_memory, "_metadata", lambda argv, device: {"gpu": "Test GPU", "trainwise_device": device})
    monkeypatch.setattr(validate_memory, "_device_used_bytes", lambda: None)
    monkeypatch.setattr(validate_memory, "predict", lambda config: {
        "status": "ok", "peak_allocated": 2 * GiB, "peak_reserved": 3 * GiB, "device_total": 4 * GiB,
        "device_name": "H100-80GB"})
    seen = []

    def measure(config, baseline):  # the rows file holds every earlier row when a row starts
        rows_file = tmp_path / "rows.json"
        seen.append(len(json.loads(rows_file.read_text())["rows"]) if rows_file.exists() else 0)
        return {"status": "ok", "peak_allocated": 2 * GiB, "peak_reserved": 3 * GiB, "device_total": 4 * GiB}

    monkeypatch.setattr(validate_memory, "measure", measure)
    out, rows = tmp_path / "memory.md", tmp_path / "rows.json"

    assert validate_memory.main(["--only", "^bert b4", "--out", str(out), "--rows", str(rows)]) == 0

    launch = json.loads(rows.read_text())
    names = [row["name"] for row in launch["rows"]]
    assert seen == list(range(len(names))) and len(names) >= 4
    assert launch["provenance"]["command"].startswith("python benchmarks/validate_memory.py --only")
    found = provenance.parse(out.read_text())
    assert found["command"] == f"`python benchmarks/render_memory.py {rows} --out {out}`"
    assert f"{len(names)} of {len(names)} configurations measured." in out.read_text()


def test_bench_page_prints_no_ratio_when_either_engine_moved_more_than_ten_percent_between_repeats():
    import bench_page

    assert bench_page._ratio([4.0, 4.1, 4.2], [2.0, 2.05, 2.1]) == "2.00x"
    # The busy-machine figures of an earlier bench page: 6.2 vs 1.1 samples/s read "5.56x".
    assert bench_page._ratio([6.2, 1.2, 11.2], [1.0, 1.1, 3.3]).startswith("not shown: spread")
    assert bench_page._ratio([4.0], [2.0]) == "not shown: one sample: no spread to judge it by"
    assert bench_page._ratio([4.0, 4.1], [2.0, 2.05], busy="machine busy: load 3.1 on 2 CPUs") == (
        "not shown: machine busy: load 3.1 on 2 CPUs")


RENDERED = [p for p in PAGES if re.search(r"^- command: `python benchmarks/render_\w+\.py ", p.read_text(), flags=re.M)]


@pytest.mark.parametrize("page", RENDERED, ids=[p.name for p in RENDERED])
def test_a_page_rendered_from_rows_files_is_what_its_rows_render_to_now(page, tmp_path):
    import importlib
    import shlex

    command = shlex.split(provenance.parse(page.read_text())["command"].strip("`"))
    script = importlib.import_module(Path(command[1]).stem)
    argv = command[2:]
    argv[argv.index("--out") + 1] = str(tmp_path / "page.md")
    argv = [str(REPO / arg) if arg.startswith("docs/") else arg for arg in argv]
    assert script.main(argv) == 0
    without_command = lambda text: re.sub(r"^- command: .*$", "", text, flags=re.M)  # noqa: E731 - it names the output
    assert without_command((tmp_path / "page.md").read_text()) == without_command(page.read_text()), (
        f"{page.name} differs from what {command[1]} renders from its rows now: run the command again")


def test_render_engine_speed_shows_no_ratio_for_a_launch_cut_before_its_timed_runs(tmp_path):
    import render_engine_speed

    prov = {"command": "python benchmarks/engine_speed.py m", "commit": "c" * 40, "device": "GPU Test (80.00 GiB) x 1",
            "versions": "python 3, torch 2, transformers 5, trainwise 0.1.0", "date": "2026-01-01 00:00 UTC"}
    cut = {"model": "m", "given": {"seq_len": 64}, "provenance": prov,
           "trainwise_fit": {"batch_size": 4, "tried": [[4, "ok", ""], [8, "oom", "out of memory"]]}}
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"launches": [cut]}))
    out = tmp_path / "page.md"
    assert render_engine_speed.main([str(rows), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| m | not measured (the launch ended before its timed runs) | - |" in text
    assert "- m, trainwise: tried 4: ok, 8: oom; largest that ran: 4\n" in text


def _hand_assembled(page: Path) -> bool:
    """A page whose provenance says a person put it together (no script rendered it)."""
    return "by hand" in provenance.parse(page.read_text()).get("command", "")


def test_wherever_readme_quotes_a_hand_assembled_page_it_says_so():
    readme = (REPO / "README.md").read_text().splitlines()
    quoted = [(line, REPO / link) for line in readme for link in re.findall(r"\((docs/results/[\w.-]+\.md)\)", line)]
    assert quoted, "README quotes no results page"
    for line, page in quoted:
        if _hand_assembled(page):
            assert "by hand" in line, f"README quotes {page.name}, assembled by hand, without saying so: {line[:120]}"


def test_a_hand_assembled_page_is_recognised_from_its_provenance():
    assert _hand_assembled(REPO / "docs" / "results" / "memory-H100.md")
    assert not _hand_assembled(REPO / "docs" / "results" / "time-model-cpu.md")


def test_a_page_is_busy_when_other_processes_used_the_cpu_not_when_its_own_work_raised_the_load():
    """A 2-core benchmark drives the load average to about 2 itself: what others used decides."""
    own_work = {"load_start": 0.2, "load_end": 2.1, "cores": 2, "others_cpus": 0.05}
    assert not provenance.busy(own_work) and provenance.load_line(own_work).endswith(": quiet")
    shared = {**own_work, "others_cpus": 1.2}
    assert provenance.busy(shared) and "other processes used 1.2 CPUs" in provenance.load_line(shared)
    assert provenance.busy({"load_start": 0.2, "load_end": 2.1, "cores": 2})  # older rows: the load average rule


def test_others_cpu_use_since_a_probe_leaves_out_this_process_trees_own(monkeypatch):
    from trainwise.common import noise

    readings = iter([(100.0, 5.0, 1000.0), (104.0, 8.0, 1002.0)])  # machine busy s, ours, clock

    def probe():
        busy, own, at = next(readings)
        return {"machine_busy_s": busy, "own_cpu_s": own, "at": at}

    monkeypatch.setattr(noise, "cpu_probe", probe)
    first = provenance.cpu_probe()
    assert provenance.others_cpus_since(first) == 0.5  # (4 - 3) CPU-seconds over 2 s
    assert noise.machine_busy_s() is None or noise.machine_busy_s() > 0


@pytest.mark.parametrize("others_cpus", [0.01, 1.2])
def test_the_plan_search_page_says_the_machine_was_shared_only_when_it_was(others_cpus):
    """It said so on every page, quiet runs included (0.01 other CPUs)."""
    import plan_search_time

    prov = {"others_cpus": others_cpus}
    row = {"case": "8B-1gpu", "target_s": 30.0, "wall_s": 18.4, "cpu_s": 18.9, "wall_spread": 0.05,
           "cpu_spread": 0.05, "peak_rss_bytes": 4.4e8, "met": True,
           "last": {"load_before": 0.8, "search_s": 15.8, "screened": 1344, "estimates": 40, "best": "x",
                    "best_step_s": 10.0, "best_mfu": 0.44}}
    body = plan_search_time.page_body([row], 3, provenance.busy(prov))
    assert ("was shared" in body) == (others_cpus > 0.5)
    assert ("Nothing else used the CPU" in body) == (others_cpus <= 0.5)


def test_render_vs_trainer_shows_the_paired_ratio_and_each_pair_or_why_it_is_withheld(tmp_path):
    import render_vs_trainer

    shown = _vs_launch(30, {"trainwise": [11.0, 16.5], "hf-trainer": [10.0, 15.3]}, True)
    shown["result"].update(samples_per_s_ratio_paired=1.089, paired_withheld=None, paired_ratios=[1.1, 1.0784])
    withheld = _vs_launch(40, {"trainwise": [11.0, 16.5], "hf-trainer": [10.0, 12.0]}, True)
    withheld["result"].update(samples_per_s_ratio_paired=None, paired_ratios=[1.1, 1.375],
                              paired_withheld="the pairs' ratios spread 25.0 % > 10 %")
    rows = tmp_path / "vs.json"
    rows.write_text(json.dumps({"launches": [shown, withheld]}))
    out = tmp_path / "vs.md"
    assert render_vs_trainer.main([str(rows), "--out", str(out)]) == 0
    table = [line for line in out.read_text().splitlines() if line.startswith("| ") and "launch" not in line]
    assert "| 1.089 | 1.100 1.078 | 1.250 |" in table[0]
    assert "| not shown: the pairs' ratios spread 25.0 % > 10 % | 1.100 1.375 |" in table[1]
