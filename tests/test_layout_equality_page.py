"""benchmarks/layout_equality.py judges a layout by its largest relative loss difference."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_equality  # noqa: E402
from layout_equality import Case, compare  # noqa: E402


def test_a_layout_is_equal_only_within_the_tolerance_at_every_step():
    case = Case("TP 2 x PP 2", "tiny-llama", ["--tp", "2", "--pp", "2"], 2, nodes=2)
    assert case.world == 4 and case.data_parallel() == 1
    reference = {"losses": [2.0, 1.0]}
    assert compare(case, {"losses": [2.0, 1.00005], "seconds": 1.0}, reference)["verdict"] == "equal"
    late = compare(case, {"losses": [2.0, 1.0002], "seconds": 1.0}, reference)
    assert late["verdict"] == "differs" and abs(late["max_relative"] - 2e-4) < 1e-9
    refused = compare(case, {"error": "exit 2: refused"}, reference)
    assert refused["verdict"] == "did not run" and "refused" in refused["why"]
    assert "| did not run: exit 2: refused |" in layout_equality.render([refused])


def test_the_reference_accumulates_what_the_data_parallel_ranks_share():
    assert Case("ZeRO-3 2 x TP 2 x PP 2", "m", ["--zero", "3", "--tp", "2", "--pp", "2"], 8).data_parallel() == 2
    assert Case("2 nodes: ZeRO-3 4", "m", ["--zero", "3"], 2, nodes=2).data_parallel() == 4
