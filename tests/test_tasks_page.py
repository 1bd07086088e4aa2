"""docs/results/tasks-cpu.md claims of each row only what tests/test_tasks_beyond_text.py
holds (tests/tiny_tasks.py), and benchmarks/tasks_cpu.py trains each row with its plan's flags."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import tasks_cpu  # noqa: E402
from tiny_tasks import GAPS, HELD, MODELS, PLANS, claim  # noqa: E402

PAGE = REPO / "docs" / "results" / "tasks-cpu.md"


def _rows() -> list[list[str]]:
    lines = [line for line in PAGE.read_text().splitlines() if line.startswith("| tiny-")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_every_row_of_the_page_says_what_the_tests_hold_of_it():
    rows = _rows()
    assert len(rows) == len(MODELS) * len(PLANS)
    for model, _task, plan, *_, said in rows:
        assert said == claim(model, plan), (model, plan)


def test_no_row_the_tests_do_not_hold_is_said_to_be_held():
    assert ("tiny-convnext", "fp32") not in HELD and claim("tiny-convnext", "fp32").startswith("expected failure")
    assert "held" not in claim("tiny-convnext", "grad-ckpt") and "held" not in claim("tiny-vit", "bf16")
    assert not set(HELD) & set(GAPS)
    page = PAGE.read_text()
    assert "hold fp32, checkpointing and LoRA within 3 %" not in page  # the old blanket claim


def test_each_plan_trains_with_its_own_flags():
    assert tasks_cpu.flags_of("fp32") == []
    assert tasks_cpu.flags_of("grad-ckpt") == ["--grad-ckpt"]
    assert tasks_cpu.flags_of("lora r4") == ["--lora-rank", "4"]
    assert tasks_cpu.flags_of("bf16-pure") == ["--precision", "bf16-pure"]
