"""The body of docs/results/time-model-published.md (benchmarks/published_gpu.py predicts)."""

from __future__ import annotations


def _pct(value, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f} %" if signed else f"{value:.1f} %"


def _rho(value) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _layout(row: dict) -> str:
    layout = row["layout"]
    parts = [f"{row['gpus']} GPU{'s' if row['gpus'] > 1 else ''}", f"DP {layout['dp']}"]
    parts += [f"{key.upper()} {layout[key]}" for key in ("tp", "pp", "vp", "cp") if layout.get(key, 1) != 1]
    if layout.get("sharding", "none") != "none":
        parts.append(layout["sharding"].replace("zero", "ZeRO-"))
    return ", ".join(parts)


def _batch(row: dict) -> str:
    return f"{row['micro_batch']} x {row['grad_accum']} / {row['global_batch']} x {row['seq_len']}"


def _row_line(p) -> str:
    row = p.row
    predicted = f"{p.predicted_step_s:.3f}" if p.predicted_step_s is not None else "-"
    tokens = f"{p.predicted_tokens_per_gpu:,.0f}" if p.predicted_tokens_per_gpu is not None else "-"
    mfu = f"{100 * p.predicted_mfu:.0f} %" if p.predicted_mfu is not None else "-"
    measured = f"{row['measured']['value']:,} {row['measured']['unit']}"
    return (f"| {row['id']} | {row['gpu']} | {row['model']} | {_layout(row)} | {_batch(row)} | {row['precision']}"
            f"{', ckpt' if row['activation_checkpointing'] else ''}{', LoRA' if row.get('lora') else ''} | "
            f"{measured} | {p.published_step_s:.3f} | {predicted} | {_pct(p.error_pct, signed=True)} | "
            f"{p.published_tokens_per_gpu:,.0f} | {tokens} | {mfu} | {p.note or ''} |")


ROW_HEADER = ("| row | GPU | model | layout | batch: micro x accum / global x tokens | precision | published "
              "(as published) | published step (s) | predicted step (s) | error | published tokens/s/GPU | "
              "predicted tokens/s/GPU | predicted MFU | note |\n"
              "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")


def _summary_lines(summary: dict, sources: dict) -> list[str]:
    lines = ["| rows | n predicted | MAPE | median absolute error | Spearman (step s) |", "|---|---:|---:|---:|---:|"]
    for key, found in summary["sources"].items():
        held = " (held out)" if sources[key].get("held_out") else ""
        lines.append(f"| source {key}{held} | {found['n']} | {_pct(found['mape_pct'])} | "
                     f"{_pct(found['median_pct'])} | {_rho(found['spearman'])} |")
    for (source, gpu), found in summary.get("source_gpus", {}).items():
        lines.append(f"| source {source}, {gpu} only | {found['n']} | {_pct(found['mape_pct'])} | "
                     f"{_pct(found['median_pct'])} | {_rho(found['spearman'])} |")
    for label, key in (("overall (sources not held out)", "overall"), ("held out", "held_out"), ("every row", "all")):
        found = summary[key]
        lines.append(f"| {label} | {found['n']} | {_pct(found['mape_pct'])} | {_pct(found['median_pct'])} | "
                     f"{_rho(found['spearman'])} |")
    return lines


def _source_lines(sources: dict) -> list[str]:
    lines = []
    for key, source in sources.items():
        held = " **Held out** from any change to the time model." if source.get("held_out") else ""
        lines.append(f"- `{key}`: {source['name']}; {source['url']} ({source['file']} at commit "
                     f"{source['commit']}); engine: {source['engine']}.{held}")
    return lines


def render(predictions: list, summary: dict, sources: dict, verdict: str) -> str:
    """Markdown: what is compared, the sources, the summary, then one line per row."""
    lines = ["No GPU was used: every trainwise figure below is a **prediction** of "
             "`trainwise.api.estimate(model, plan, gpus_per_node=..., inter_node_gbps=...)` from the catalog "
             "figures of the row's GPU times the catalog's assumed efficiencies (docs/plan.md, \"Device "
             "profiles\"); every published figure is a **measurement** copied from its source "
             "(benchmarks/published_gpu_runs.yaml). The compared quantity is seconds per optimizer step of the "
             "whole job; published step = global batch x tokens / (published tokens/s per GPU x GPUs). "
             "Error = (predicted - published) / published.", "",
             f"**Verdict** on the sources not held out: {verdict}.", "", "## Sources", "",
             *_source_lines(sources), "", "## Accuracy", "", *_summary_lines(summary, sources), "",
             "## Rows", "", ROW_HEADER, *(_row_line(p) for p in predictions)]
    return "\n".join(lines) + "\n"
