"""README.md's Quickstart is true: its blocks are what the commands print now (times,
speeds, CPU losses and temporary paths masked), and the masks hide only what varies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import readme_quickstart as quickstart  # noqa: E402


def test_the_mask_hides_times_speeds_and_cpu_losses_but_not_predictions():
    line = "step 20/20  loss 6.4965  97 tok/s  1.5 samples/s  MFU n/a  peak 12.6 MiB"
    assert quickstart.mask(line) == "step 20/20  loss <loss>  <n> tok/s  <n> samples/s  MFU n/a  peak 12.6 MiB"
    assert quickstart.mask("│ time (s)       │    65.88 │") == "│ time (s)       │ <n> │"
    assert quickstart.mask("│ tokens/s (job)  │  7,999.5 │") == "│ tokens/s (job)  │ <n> │"
    assert quickstart.mask("448 plans screened, 25 estimates, 159.5 s; fit") == \
        "448 plans screened, 25 estimates, <n> s; fit"
    kept = "│ peak allocated     │ 71.51 GiB │       62.13 │       100.0 % │"
    assert quickstart.mask(kept) == kept
    assert quickstart.mask("│ 1 │ 46.34 GiB │ 2.43 │ 53,989 │ 45 % │") == "│ 1 │ 46.34 GiB │ 2.43 │ 53,989 │ 45 % │"


def test_a_changed_prediction_in_a_block_is_a_difference():
    readme = quickstart.README.read_text()
    shown = quickstart.readme_blocks(readme)
    assert quickstart.differences(readme, shown) == []
    changed = dict(shown, estimate=shown["estimate"].replace("GiB", "MiB", 1))
    assert quickstart.differences(readme, changed) == ["estimate"]


@pytest.mark.slow
def test_the_readme_quickstart_blocks_are_what_the_commands_print_now():
    blocks, picture = quickstart.run_all()
    readme = quickstart.README.read_text()
    stale = quickstart.differences(readme, blocks)
    assert not stale, (f"README.md quickstart blocks {stale} differ from a run now; "
                       "run `python benchmarks/readme_quickstart.py` and commit the result")
    assert picture.startswith(b"\x89PNG") and quickstart.PICTURE.read_bytes().startswith(b"\x89PNG")
    for name, argv in quickstart.COMMANDS:
        assert f"$ trainwise {' '.join(argv)}" in readme


def test_the_search_progress_lines_are_left_out_as_a_terminal_clears_its_bar():
    from trainwise.api.search_layouts import LAYOUT_SCREENING
    from trainwise.search.screen_and_confirm import CONFIRMING, SCREENING

    assert all(quickstart.PROGRESS_LINE.match(f"{what}: 3/16") for what in (SCREENING, CONFIRMING, LAYOUT_SCREENING))
    assert not quickstart.PROGRESS_LINE.match("step 2/20  loss 6.8972")
