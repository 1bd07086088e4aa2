"""Under --compile the estimate shows the eager step's memory as an upper bound
(docs/estimate.md, "Compiled steps"). Pinned here on a real CPU step: tiny-llama compiled
block by block peaks below the eager estimate, by exactly what AOTAutograd's partitioner
recomputes in backward instead of saving."""

from __future__ import annotations

from compiled_step import second_step_peak
import pytest

from trainwise.api import estimate
from trainwise.engine.compile_cache import CACHE_ENV
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan

BATCH, SEQ = 4, 64


@pytest.mark.slow  # one cold compile of two blocks: 15-30 s on a busy 2-core CPU
def test_a_block_compiled_step_peaks_below_the_eager_estimate_by_what_the_partitioner_recomputes(
        monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "compile"))  # cold, and not the user's cache
    plan = Plan(device="cpu", batch_size=BATCH, seq_len=SEQ)
    eager, compiled = (second_step_peak("tiny-llama", p)[0] for p in (plan, plan.replace(compile=True)))
    bound = estimate("tiny-llama", plan.replace(compile=True)).memory.peak_allocated
    assert compiled <= bound, "the compiled step exceeded the figure the estimate calls its upper bound"
    # Per block the eager step saves SiLU's output for the gated product and, in each of
    # the two RMSNorms, x * rsqrt for the weight's multiply; the compiled backward
    # recomputes all three (element-wise, used only by element-wise ops in backward).
    config = resolve_model("tiny-llama").config
    per_block = BATCH * SEQ * (config.intermediate_size + 2 * config.hidden_size) * 4
    assert eager - compiled == config.num_hidden_layers * per_block
