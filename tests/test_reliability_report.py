"""benchmarks/reliability_report.py renders what the fault tests recorded, with totals."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import reliability_report  # noqa: E402
from fault_log import FaultLog, lost_files, tree_digest  # noqa: E402


def test_the_page_counts_faults_bad_inputs_and_losses_from_the_records():
    log = FaultLog()
    log.add("tests/test_a.py::test_x", kind="fault", case="kill -9 of rank 1", exit_code=0,
            message="trainwise: rank 1 failed", lost=0)
    log.add("tests/test_a.py::test_y", kind="bad input", case="--output names a file", exit_code=2,
            message="trainwise: error: --output: a | b", lost=0)
    log.add("tests/test_b.py::test_z", kind="fault", case="truncated file", exit_code=2, message="x", lost=1)
    prov = {"command": "python benchmarks/reliability_report.py", "commit": "abc (clean tree)", "device": "CPU",
            "versions": "python 3", "date": "today"}
    page = reliability_report.render(log.records, prov)
    assert "- Faults injected: 2" in page and "- Bad inputs tried: 1" in page
    assert "- Runs or files lost: 1" in page
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
