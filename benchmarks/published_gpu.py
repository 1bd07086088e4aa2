"""Predict published GPU training runs with trainwise's estimate and compare.

Reads benchmarks/published_gpu_runs.yaml (one published measurement per row, with its
source), predicts each row's step with `trainwise.api.estimate` on the catalog figures of
the row's GPU (no GPU is used: every trainwise figure here is a prediction), and writes
docs/results/time-model-published.md: per-row error, MAPE and median error per source and
overall, the rank correlation within each source, with the held-out source apart.

    PYTHONPATH=.venv/torchao python benchmarks/published_gpu.py --out docs/results/time-model-published.md
    python benchmarks/published_gpu.py --only lf-h100-1b-2k,tw-h100-bertlarge-trainwise

The compared quantity is seconds per optimizer step of the whole job:
published = global_batch x seq_len / (tokens/s per GPU x GPUs); predicted = the estimate's
`time.step_s` (the slowest pipeline rank, communication included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

import provenance
from time_model import spearman

REPO = Path(__file__).resolve().parent.parent
ROWS = REPO / "benchmarks" / "published_gpu_runs.yaml"
MODELS = REPO / "benchmarks" / "published_models"
PAGE = REPO / "docs" / "results" / "time-model-published.md"
# Issue 26's targets: overall MAPE and the worst source's median absolute error, in %.
TARGET_MAPE_PCT = 15.0
TARGET_SOURCE_MEDIAN_PCT = 20.0
# Published precision -> trainwise's --precision and --float8.
PRECISIONS = {"amp_bf16": ("bf16", False), "bf16 autocast": ("bf16", False), "bf16": ("bf16-pure", False),
              "fp8": ("bf16", True)}
SHARDING = {"none": None, "zero1": 1, "zero2": 2, "zero3": 3}


@dataclass(frozen=True)
class Prediction:
    """One row's outcome: step seconds (published and predicted) or why there is none."""

    row: dict
    published_step_s: float
    predicted_step_s: float | None
    published_tokens_per_gpu: float
    predicted_tokens_per_gpu: float | None
    predicted_mfu: float | None
    note: str

    @property
    def error_pct(self) -> float | None:
        """Signed error of the predicted step time, % of the published one."""
        if self.predicted_step_s is None:
            return None
        return 100 * (self.predicted_step_s - self.published_step_s) / self.published_step_s


def load(path: Path = ROWS) -> tuple[dict, list[dict]]:
    """(sources by key, rows) of the rows file."""
    data = yaml.safe_load(path.read_text())
    return data["sources"], data["rows"]


def published_tokens_per_gpu(row: dict) -> float:
    """The row's measured tokens/s per GPU, converted from the unit it was published in."""
    value, unit = float(row["measured"]["value"]), row["measured"]["unit"]
    if unit == "tokens/s/GPU":
        return value
    if unit == "samples/s":  # the whole job's samples per second
        return value * row["seq_len"] / row["gpus"]
    raise ValueError(f"{row['id']}: unknown unit {unit!r}")


def published_step_s(row: dict) -> float:
    """Seconds per optimizer step of the whole job, from the published throughput."""
    return row["global_batch"] * row["seq_len"] / (published_tokens_per_gpu(row) * row["gpus"])


def model_for(row: dict, scratch: Path) -> str:
    """A catalog name, or a directory holding the row's config (a published_models file,
    its learned position table sized to the row's sequence, as MPT sizes it)."""
    file = MODELS / f"{row['model']}.json"
    if not file.is_file():
        return row["model"]
    config = json.loads(file.read_text())
    config["n_positions"] = row["seq_len"]
    folder = scratch / f"{row['model']}-{row['seq_len']}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def plan_knobs(row: dict) -> dict:
    """The trainwise Plan that runs the row's layout, batch and precision."""
    layout = row["layout"]
    tp, pp, dp = layout.get("tp", 1), layout.get("pp", 1), layout["dp"]
    if layout.get("cp", 1) != 1:
        raise ValueError("context parallel is not a trainwise layout")
    precision, float8 = PRECISIONS[row["precision"]]
    # trainwise runs float8 compiled only (eager float8 is slower than bf16: techniques/float8.py).
    knobs = dict(device=row["gpu"], precision=precision, float8=float8, compile=float8, seq_len=row["seq_len"],
                 batch_size=row["micro_batch"], grad_accum=row["grad_accum"], nproc=row["gpus"],
                 grad_ckpt=bool(row["activation_checkpointing"]), optim=row.get("optimizer", "adamw"),
                 attention="sdpa", tp=tp, pp=pp, lora_rank=16 if row.get("lora") else 0)
    zero = SHARDING[layout.get("sharding", "none")]
    if zero is not None and dp > 1:
        knobs.update(fsdp=dp, zero=zero)
    elif dp > 1:
        knobs.update(dp=dp)
    if pp > 1:
        # One schedule step runs the whole optimizer step: the micro-batches are its chunks.
        knobs.update(batch_size=row["micro_batch"] * row["grad_accum"], grad_accum=1,
                     microbatches=row["grad_accum"],
                     pp_schedule="interleaved-1f1b" if layout.get("vp", 1) > 1 else "1f1b")
    return knobs


# Where trainwise refuses a published layout, the nearest plan it runs, tried in this order
# and named in the row (the refused flag -> what replaces it). Megatron's distributed
# optimizer shards only the optimizer state: without it, the same bytes cross the links
# once a step (an all-reduce instead of a reduce-scatter and an all-gather).
SUBSTITUTES = {"--float8": ("fp8 -> bf16", {"float8": False, "compile": False}),
               "--zero": ("ZeRO-1 -> plain data parallel", {"zero": None, "fsdp": 1})}


def estimate_row(row: dict, sources: dict, scratch: Path) -> tuple[object, tuple[str, ...]]:
    """(the estimate of the row's plan, or of the nearest plan trainwise runs, the
    substitutions made); InputError or ValueError when none runs."""
    from trainwise.api.estimate import estimate
    from trainwise.common.errors import InputError
    from trainwise.plan.plan import Plan

    knobs, made = plan_knobs(row), ()
    gbps = row.get("inter_node_gbps", sources[row["source"]].get("inter_node_gbps"))
    while True:
        try:
            plan = Plan(**knobs)
            return estimate(model_for(row, scratch), plan, gpus_per_node=row["gpus_per_node"],
                            inter_node_gbps=gbps), made
        except InputError as err:
            label, change = SUBSTITUTES.get(err.field, (None, None))
            if label is None or label in made:
                raise
            if change.get("zero", 0) is None and knobs.get("dp", 1) == 1 and knobs.get("fsdp", 1) > 1:
                change = {**change, "dp": knobs["fsdp"]}
            knobs, made = {**knobs, **change}, (*made, label)


def predict(row: dict, sources: dict, scratch: Path) -> Prediction:
    """The row predicted by trainwise.api.estimate (catalog figures of its GPU)."""
    from trainwise.common.errors import InputError

    published, tokens_published = published_step_s(row), published_tokens_per_gpu(row)
    try:
        result, made = estimate_row(row, sources, scratch)
    except (InputError, ValueError) as err:
        return Prediction(row, published, None, tokens_published, None, None, f"not predicted: {err}")
    if result.time is None:
        return Prediction(row, published, None, tokens_published, None, None, "no time predicted")
    step = result.time.step_s
    tokens = row["global_batch"] * row["seq_len"] / (step * row["gpus"])
    notes = [f"predicted as the nearest plan trainwise runs: {'; '.join(made)}"] if made else []
    if row["layout"].get("vp", 1) > 2:
        notes.append(f"published: {row['layout']['vp']} virtual stages per pipeline rank; trainwise's "
                     "interleaved 1F1B holds 2")
    return Prediction(row, published, step, tokens_published, tokens, result.time.mfu, "; ".join(notes))


def accuracy(predictions: list[Prediction]) -> dict:
    """{"n", "mape_pct", "median_pct", "spearman"} of the predicted rows (absolute % errors;
    Spearman of predicted vs published step seconds)."""
    done = [p for p in predictions if p.error_pct is not None]
    if not done:
        return {"n": 0, "mape_pct": None, "median_pct": None, "spearman": None}
    errors = [abs(p.error_pct) for p in done]
    rho = spearman([p.predicted_step_s for p in done], [p.published_step_s for p in done]) if len(done) > 2 else None
    return {"n": len(done), "mape_pct": statistics.fmean(errors), "median_pct": statistics.median(errors),
            "spearman": rho}


def summarize(predictions: list[Prediction], sources: dict) -> dict:
    """Accuracy per source and per (source, GPU), over the sources a change may be tuned on
    ("overall"), over the held-out ones, and over every row."""
    held = {key for key, source in sources.items() if source.get("held_out")}
    by_source = {key: accuracy([p for p in predictions if p.row["source"] == key]) for key in sources}
    pairs = sorted({(p.row["source"], p.row["gpu"]) for p in predictions})
    by_gpu = {pair: accuracy([p for p in predictions if (p.row["source"], p.row["gpu"]) == pair]) for pair in pairs}
    return {"sources": by_source, "source_gpus": by_gpu,
            "overall": accuracy([p for p in predictions if p.row["source"] not in held]),
            "held_out": accuracy([p for p in predictions if p.row["source"] in held]),
            "all": accuracy(predictions)}


def verdict(summary: dict, sources: dict) -> str:
    """Issue 26's targets on the sources a change may be tuned on."""
    tuned = [key for key, source in sources.items() if not source.get("held_out")]
    overall = summary["overall"]["mape_pct"]
    medians = {key: summary["sources"][key]["median_pct"] for key in tuned}
    worst = max((m for m in medians.values() if m is not None), default=None)
    met = overall is not None and overall <= TARGET_MAPE_PCT and worst is not None and worst <= TARGET_SOURCE_MEDIAN_PCT
    overall_text = f"{overall:.1f} %" if overall is not None else "none"
    worst_text = f"{worst:.1f} %" if worst is not None else "none"
    return (f"targets (overall MAPE <= {TARGET_MAPE_PCT:.0f} %, every source's median <= "
            f"{TARGET_SOURCE_MEDIAN_PCT:.0f} %): {'met' if met else 'NOT met'} (overall MAPE {overall_text}, "
            f"worst source median {worst_text})")


def missing_tracers(rows: list[dict]) -> str | None:
    """Why these rows cannot be predicted as published here, or None. A float8 plan is
    traced through torchao's float8 training modules; without torchao on the path the
    estimate refuses --float8 and the row would be predicted as bf16, a different page."""
    import importlib.util

    fp8 = [row["id"] for row in rows if PRECISIONS[row["precision"]][1]]
    if fp8 and importlib.util.find_spec("torchao") is None:
        return (f"rows {', '.join(fp8[:3])}{' ...' if len(fp8) > 3 else ''} are fp8 and torchao is not importable "
                "(float8 plans are traced through it): run `make .venv/torchao`, then this command with "
                "PYTHONPATH=.venv/torchao")
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=Path, default=ROWS, help="the published rows file (YAML)")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write")
    parser.add_argument("--only", default=None, help="comma-separated row ids (default: every row)")
    parser.add_argument("--json", type=Path, default=None, help="also write each row's prediction as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sources, rows = load(args.rows)
    if args.only:
        wanted = set(args.only.split(","))
        rows = [row for row in rows if row["id"] in wanted]
    missing = missing_tracers(rows)
    if missing:
        print(f"published_gpu.py: error: {missing}", file=sys.stderr)
        return 2
    prov = provenance.collect(provenance.script_command("published_gpu.py", argv))
    prov["extra"] = {"GPU": "none used; trainwise's figures are predictions from the catalog, the published "
                            "ones are measurements copied from their sources"}
    with tempfile.TemporaryDirectory() as scratch:
        predictions = [predict(row, sources, Path(scratch)) for row in rows]
    summary = summarize(predictions, sources)
    from render_published import render

    body = render(predictions, summary, sources, verdict(summary, sources))
    text = provenance.page("Time model against published GPU runs", provenance.finish(prov), body)
    from trainwise.common.atomic import atomic_write_text

    atomic_write_text(args.out, text)
    if args.json:
        atomic_write_text(args.json, json.dumps([as_json(p) for p in predictions], indent=1) + "\n")
    print(verdict(summary, sources))
    return 0


def as_json(prediction: Prediction) -> dict:
    return {"id": prediction.row["id"], "source": prediction.row["source"],
            "published_step_s": prediction.published_step_s, "predicted_step_s": prediction.predicted_step_s,
            "error_pct": prediction.error_pct, "note": prediction.note}


if __name__ == "__main__":
    provenance.add_repo_to_path()
    sys.exit(main())
