"""benchmarks/step_sizes.py: the sizes it reads, the error it takes the common factor out
of, and one real sweep of two tiny sizes against a profile."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from trainwise.hardware.profile import DeviceProfile, Rate, write_profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import step_sizes  # noqa: E402


def test_sizes_are_batch_by_tokens_and_a_bad_one_is_named():
    assert step_sizes.parse_sizes("1x8, 4x64") == [(1, 8), (4, 64)]
    for bad in ("4by64", "0x64", "4x", "4x64x2"):
        with pytest.raises(ValueError, match="--sizes"):
            step_sizes.parse_sizes(f"1x8,{bad}")
    with pytest.raises(ValueError, match="at least two"):
        step_sizes.parse_sizes("4x64")


def test_a_factor_every_size_shares_leaves_no_shape_error():
    rows = [{"size": s, "predicted_s": 2 * m, "measured_s": m} for s, m in (("1x8", 1.0), ("4x64", 3.0), ("8x256", 9.0))]
    found = step_sizes.shaped(rows)
    assert [round(row["error"], 9) for row in found] == [1.0, 1.0, 1.0]
    assert [round(row["shape_error"], 9) for row in found] == [0.0, 0.0, 0.0]


def test_the_shape_error_is_against_the_rounds_median_ratio():
    # Predicted/measured 1.0, 1.2 and 1.5: the median 1.2 is the common factor.
    rows = [{"size": "a", "predicted_s": 1.0, "measured_s": 1.0}, {"size": "b", "predicted_s": 1.2, "measured_s": 1.0},
            {"size": "c", "predicted_s": 3.0, "measured_s": 2.0}]
    found = step_sizes.shaped(rows)
    assert [round(row["shape_error"], 6) for row in found] == [round(1 / 1.2 - 1, 6), 0.0, 0.25]


def test_a_sweep_times_every_size_and_prints_one_json_object(tmp_path):
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {"fp32": Rate(1e10, 1e-6)},
                            Rate(1e10, 1e-6), 5e-6)
    path = write_profile(profile, tmp_path / "cpu.json")
    out = io.StringIO()
    with redirect_stdout(out):
        assert step_sizes.main(["--profile", str(path), "--sizes", "1x8,2x8", "--rounds", "2", "--seconds", "0.001",
                                "--json"]) == 0
    report = json.loads(out.getvalue())
    assert report["model"] == "tiny-llama" and len(report["rounds"]) == 2
    for rows in report["rounds"]:
        assert [row["size"] for row in rows] == ["1x8", "2x8"]
        assert all(row["measured_s"] > 0 and row["predicted_s"] > 0 for row in rows)
    assert report["provenance"]["command"].startswith("python benchmarks/step_sizes.py --profile")


@pytest.mark.parametrize("argv, message", [([], "--profile: no such file"), (["--rounds", "0"], "--rounds: must be"),
                                           (["--seconds", "0"], "--seconds: must be more than 0")])
def test_bad_flags_are_refused_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        step_sizes.main(["--profile", str(tmp_path / "none.json"), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
