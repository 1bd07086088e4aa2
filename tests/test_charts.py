"""`estimate --chart` and `plan --chart`: the PNG is written (and signed, so a file of the
user's is never replaced), and the data drawn is the estimate's and the search's own numbers."""

from __future__ import annotations

import dataclasses

import pytest

from test_search import formula
from trainwise.api import estimate
from trainwise.api import search as search_api
from trainwise.cli.chart_file import PNG_SIGNATURE
from trainwise.cli.estimate_chart import CACHE, CONTEXT, UNSPLIT, anatomy_chart
from trainwise.cli.main import main
from trainwise.cli.plan_chart import plan_chart
from trainwise.cli.render_estimate import PARTS
from trainwise.plan import Plan

TINY = dict(device="H100", seq_len=64, batch_size=2)


def test_the_anatomy_bar_is_the_estimates_parts_at_the_peak_and_sums_to_its_device_total():
    result = estimate("tiny-llama", Plan(**TINY))
    chart = anatomy_chart(result)
    (bar,) = chart.bars
    memory = result.memory
    drawn = {s.label: s.nbytes for s in bar.segments}
    labels = {key: label for key, label, _ in PARTS}
    assert {labels[k]: v for k, v in memory.at_peak.items() if v} == {k: v for k, v in drawn.items()
                                                                       if k not in (CACHE, CONTEXT, UNSPLIT)}
    assert drawn.get(UNSPLIT, 0) == memory.peak_allocated - sum(memory.at_peak.values())
    assert drawn[CACHE] == memory.peak_reserved - memory.peak_allocated
    assert drawn[CONTEXT] == memory.device_total - memory.peak_reserved
    assert bar.total == memory.device_total
    assert chart.capacity_bytes == result.device.memory_bytes and "(predicted)" in chart.title


def test_a_peak_its_parts_fall_short_of_is_drawn_whole():
    """Block extrapolation fits the peak and its parts apart: the bar still reaches the device total."""
    result = estimate("tiny-llama", Plan(**TINY))
    memory = dataclasses.replace(result.memory, peak_allocated=result.memory.peak_allocated + 2**20)
    (bar,) = anatomy_chart(dataclasses.replace(result, memory=memory)).bars
    assert {s.label: s.nbytes for s in bar.segments}[UNSPLIT] == 2**20 and bar.total == memory.device_total


def test_a_layout_draws_one_bar_per_pipeline_rank_each_its_predicted_device_total():
    result = estimate("tiny-llama", Plan(**TINY, nproc=4, tp=2, pp=2, microbatches=2))
    chart = anatomy_chart(result)
    ranks = result.layout["pipeline_ranks"]
    assert [b.label for b in chart.bars] == ["rank 0"] + [f"pipeline rank {r['pipeline_rank']}" for r in ranks[1:]]
    assert [b.total for b in chart.bars] == [r["device_total"] for r in ranks]
    assert chart.bars[0].total == result.memory.device_total


def test_estimate_chart_writes_a_png_and_never_replaces_a_file_it_did_not_draw(tmp_path, capsys):
    path = tmp_path / "anatomy.png"
    argv = ["estimate", "tiny-llama", "--device", "H100", "--seq-len", "64", "--batch-size", "2", "--chart"]
    assert main(argv + [str(path)]) == 0
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert main(argv + [str(path)]) == 0  # its own chart may be drawn again
    foreign = tmp_path / "photo.png"
    foreign.write_bytes(PNG_SIGNATURE + b"the user's picture")
    capsys.readouterr()
    assert main(argv + [str(foreign)]) == 2
    assert foreign.read_bytes() == PNG_SIGNATURE + b"the user's picture"
    assert "trainwise: error: --chart: " in capsys.readouterr().err
    assert main(argv + [str(tmp_path / "anatomy.jpg")]) == 2


@pytest.fixture
def formula_search(monkeypatch):
    """The search judges plans by formulas (tests/test_search.py), not traces."""
    monkeypatch.setattr(search_api, "estimate_evaluator", lambda spec, profile=None: formula)


def test_the_plan_chart_draws_every_screened_plan_the_pick_and_the_alternatives_at_their_predictions(
        formula_search):
    report = search_api.plan_search("tiny-llama", Plan(device="H100", seq_len=64), global_batch=16)
    chart = plan_chart(report)
    result = report.result
    assert [(p.memory_bytes, p.speed) for p in chart.screened] == [(c.memory_bytes, c.tokens_per_s)
                                                                   for c in result.screened]
    assert [p.fits for p in chart.screened] == [c.memory_bytes <= result.usable_bytes for c in result.screened]
    assert [(p.memory_bytes, p.speed) for p in chart.ranked] == [(c.memory_bytes, c.tokens_per_s)
                                                                 for c in result.ranked]
    assert chart.ranked[0].label == "#1 (pick)" and all(p.fits for p in chart.ranked)
    assert [p.label for p in chart.alternatives] == [f"why not {knob}" for knob, _, _ in report.why_lost]
    assert chart.alternatives and chart.capacity_bytes == report.capacity_bytes
    assert chart.usable_bytes == result.usable_bytes and chart.speed_axis == "tokens/s (predicted)"


def test_plan_chart_writes_a_png(formula_search, tmp_path, capsys):
    path = tmp_path / "plans.png"
    assert main(["plan", "tiny-llama", "--device", "H100", "--seq-len", "64", "--global-batch", "16",
                 "--chart", str(path)]) == 0
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert f"chart: {path}" in capsys.readouterr().err
