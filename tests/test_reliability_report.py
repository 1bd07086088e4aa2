"""benchmarks/reliability_report.py renders what the fault tests recorded, with totals."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import reliability_report  # noqa: E402

pytest_plugins = ["pytester"]
import pytest  # noqa: E402

from fault_log import FaultLog, FaultWatch, lost_files, tree_digest  # noqa: E402


def test_the_page_counts_faults_bad_inputs_and_losses_from_the_records():
    log = FaultLog()
    log.add("tests/test_a.py::test_x", kind="fault", case="kill -9 of rank 1", exit_code=0,
            message="trainwise: rank 1 failed", lost=0, watched=12)
    log.add("tests/test_a.py::test_y", kind="bad input", case="--output names a file", exit_code=2,
            message="trainwise: error: --output: a | b", lost=0, watched=0)
    log.add("tests/test_b.py::test_z", kind="fault", case="truncated file", exit_code=2, message="x", lost=1,
            watched=3)
    prov = {"command": "python benchmarks/reliability_report.py", "commit": "abc (clean tree)", "device": "CPU",
            "versions": "python 3", "date": "today"}
    page = reliability_report.render(log.records, prov)
    assert "- Faults injected: 2" in page and "- Bad inputs tried: 1" in page
    assert "- Files lost: 1 of the 15 that the cases watched" in page
    assert "| 1 of 3 |" in page and "| 0 of 12 |" in page
    assert "a \\| b" in page  # a table cell keeps its pipe as text
    assert page.index("## Faults (2)") < page.index("## Bad inputs (1)")


def test_lost_files_counts_what_is_missing_or_changed(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_text("2")
    before = tree_digest(tmp_path)
    (tmp_path / "a").write_text("changed")
    (tmp_path / "d" / "b").unlink()
    (tmp_path / "new").write_text("3")
    assert lost_files(before, tree_digest(tmp_path)) == 2


def test_the_watch_measures_what_a_fault_removed_or_changed_and_what_a_completed_save_listed(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    checkpoint = tmp_path / "step-00000002"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    from trainwise.engine.checkpoint_manifest import write_manifest
    write_manifest(checkpoint, saved_ns=1)
    watch = FaultWatch()
    watch.watch(tmp_path / "notes.txt")
    watch.saved(checkpoint)
    assert len(watch.expected) == 2 and watch.lost() == []
    (tmp_path / "notes.txt").write_text("overwritten")
    (checkpoint / "model.safetensors").unlink()
    assert watch.lost() == sorted([str((checkpoint / "model.safetensors").resolve()),
                                   str((tmp_path / "notes.txt").resolve())])


def test_the_fixture_fails_a_case_that_lost_a_watched_file(pytester, monkeypatch):
    monkeypatch.delenv("TRAINWISE_FAULT_LOG", raising=False)  # the inner session records nothing of ours
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.syspathinsert(REPO / "tests")
    pytester.makepyfile(test_loses="""
        def test_a_fault_that_deletes_the_users_file(tmp_path, fault_log):
            (tmp_path / "notes.txt").write_text("mine")
            fault_log.watch(tmp_path)
            (tmp_path / "notes.txt").unlink()
            fault_log(kind="fault", case="rm", exit_code=0, message="")
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*rm: 1 of 1 watched files lost or changed*"])
