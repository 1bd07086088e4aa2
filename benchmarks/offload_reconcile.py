"""The reconciliation section of docs/results/offload-H100.md: why `trainwise estimate`
said the offloaded plan does not fit (device total above the device) while the run trained.

Runs on a CPU (the estimates only trace), and replaces the section between the page's
RECONCILIATION markers, leaving the measured part of the page as it is:

    python benchmarks/offload_reconcile.py --page docs/results/offload-H100.md \
        --measured-peak-allocated-gib 63.01 --usable-gib 79.18

The measured figures are the GPU run's, given on the command line so the page names them.
What it computes, for Llama-3.1-8B bf16-pure 4 x 2048 on the H100-80GB catalog device:
the offloaded plan's estimate (peak allocated, reserved, device total); the one-device
step the per-rank estimate scales from (trainwise/estimator/per_rank.py adds that step's
reserved-minus-allocated "slack" to the rank's peak); and, replaying that step's
allocations through the caching-allocator model at its reserved peak, how much of the
slack sits in wholly free segments, which the real allocator releases and retries with
before it reports out of memory (the model keeps them: caching_allocator.py's docstring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import provenance

provenance.add_repo_to_path()

GiB = 1024**3
BEGIN = "<!-- RECONCILIATION: written by benchmarks/offload_reconcile.py; do not edit by hand -->"
END = "<!-- /RECONCILIATION -->"
MODEL = "Llama-3.1-8B"
PLAN = {"device": "H100", "precision": "bf16-pure", "batch_size": 4, "seq_len": 2048}
OFFLOAD = {"zero": 3, "cpu_offload": True, "nproc": 1}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", type=Path, required=True)
    parser.add_argument("--measured-peak-allocated-gib", type=float, required=True)
    parser.add_argument("--usable-gib", type=float, required=True,
                        help="device memory free to the process when the run started (GiB)")
    args = parser.parse_args(argv)
    prov = provenance.collect(provenance.script_command("offload_reconcile.py", argv))
    figures = compute()
    section = render(figures, args, provenance.finish(prov))
    text = args.page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.page}: no {BEGIN} ... {END} markers to replace")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    from trainwise.common.atomic import atomic_write_text

    atomic_write_text(args.page, before + BEGIN + "\n" + section + END + after)
    print(f"wrote the reconciliation section of {args.page}")
    return 0


def compute() -> dict:
    """The estimates, in bytes."""
    from trainwise.api.estimate import estimate
    from trainwise.plan.plan import Plan

    offloaded = estimate(MODEL, Plan.from_dict({**PLAN, **OFFLOAD})).memory
    single = estimate(MODEL, Plan.from_dict(PLAN)).memory
    return {"offload_allocated": offloaded.peak_allocated, "offload_reserved": offloaded.peak_reserved,
            "offload_total": offloaded.device_total, "context": offloaded.context,
            "host": offloaded.host, "capacity": _capacity(),
            "single_allocated": single.peak_allocated, "single_reserved": single.peak_reserved,
            **_cache_at_reserved_peak()}


def _capacity() -> int:
    from trainwise.hardware import resolve_device

    return resolve_device(PLAN["device"]).memory_bytes


def _cache_at_reserved_peak() -> dict:
    """Replay the one-device step through the allocator model; at its reserved peak, the
    free bytes in wholly free segments (released on memory pressure) and in free parts of
    segments still partly in use (not released)."""
    from trainwise.estimator import memory as memory_model
    from trainwise.estimator.caching_allocator import CachingAllocatorModel
    from trainwise.estimator.extrapolate import extrapolated_stacks, synthesize_trace
    from trainwise.estimator.predict import traced_step
    from trainwise.hardware import resolve_device
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan

    spec, plan, device = resolve_model(MODEL), Plan.from_dict(PLAN), resolve_device(PLAN["device"])
    # The traces the one-device estimate reads, at the depths it chose; the full-depth
    # timeline below is the one it replays only when it extrapolated by repeating blocks.
    step = traced_step(spec, plan, device)
    if step.extrapolation != "repeated":
        raise SystemExit(f"{MODEL}: the one-device estimate read its memory by {step.extrapolation!r}, "
                         "not from a repeated-blocks timeline; this section replays that timeline")
    small, large = step.traces
    full = synthesize_trace(large, extrapolated_stacks(small, large), step.fit.target, small)
    trace = memory_model._device_resident(full)
    extra = [("workspace", device.cublas_workspace_bytes)] * memory_model.CUBLAS_HANDLES_PER_STEP
    allocator, best = CachingAllocatorModel(), (0, 0, 0, 0)
    for event in memory_model._allocator_events(trace, extra):
        allocator.simulate([event])
        if allocator.reserved == allocator.peak_reserved and (allocator.reserved, allocator.allocated) > best[:2]:
            free = [b for pool in (allocator._small, allocator._large) for b in pool.blocks()]
            whole = sum(b.size for b in free if b.prev is None and b.next is None)
            best = (allocator.reserved, allocator.allocated, whole, sum(b.size for b in free) - whole)
    return {"replay_reserved": best[0], "replay_allocated": best[1], "free_whole_segments": best[2],
            "free_in_used_segments": best[3]}


def render(f: dict, args, prov: dict) -> str:
    g = {key: value / GiB for key, value in f.items()}
    slack = g["offload_reserved"] - g["offload_allocated"]
    single_slack = g["single_reserved"] - g["single_allocated"]
    kept = g["offload_allocated"] + g["free_in_used_segments"] + g["context"]
    return f"""## Reconciliation: the fit check said no, the step trained

The estimate for the offloaded plan (`python -m trainwise estimate {MODEL} --device H100
--precision bf16-pure --batch-size 4 --seq-len 2048 --zero 3 --cpu-offload --nproc 1`)
next to what the run showed:

| figure | predicted (GiB) | measured (GiB) |
|---|---:|---:|
| peak allocated | {g['offload_allocated']:.2f} | {args.measured_peak_allocated_gib:.2f} |
| peak reserved | {g['offload_reserved']:.2f} | not recorded (the run was cut in step 2, before its summary) |
| device total (reserved + context {g['context']:.2f}) | {g['offload_total']:.2f} | at most {g['capacity']:.2f}: step 1 completed on this device |
| device memory | {g['capacity']:.2f} (catalog H100-80GB) | {args.usable_gib:.2f} usable, as recorded above |

Verdict: **the reserved model under CPU offload is pessimistic; the run was not lucky.**

- Peak allocated is predicted within {(g['offload_allocated'] / args.measured_peak_allocated_gib - 1) * 100:+.1f} %;
  {g['offload_allocated']:.2f} GiB allocated + {g['context']:.2f} GiB context leave
  {args.usable_gib - g['offload_allocated'] - g['context']:.1f} GiB of the {args.usable_gib:.2f} usable for the allocator's cache.
- The rank's reserved figure is its peak allocated plus a slack of {slack:.2f} GiB that the
  per-rank estimate (trainwise/estimator/per_rank.py) takes whole from the one-device step it
  scales from. That step (no offload: {g['single_allocated']:.2f} GiB allocated,
  {g['single_reserved']:.2f} GiB reserved, slack {single_slack:.2f} GiB) keeps every weight,
  gradient and AdamW moment on the device ({g['host']:.1f} GiB that offload keeps on the
  host), so its cache pattern is not the offloaded rank's.
- The allocator model keeps every segment it ever mapped. The real allocator, when a new
  segment does not fit, first releases its wholly free cached segments and retries; only
  then does it report out of memory. Replaying the one-device step through the model, at
  its reserved peak ({g['replay_reserved']:.2f} GiB reserved, {g['replay_allocated']:.2f} GiB
  allocated), {g['free_whole_segments']:.2f} GiB of the slack sits in wholly free segments
  (given back under pressure) and {g['free_in_used_segments']:.2f} GiB in free parts of
  segments still in use. Even charged that unreleasable part, the offloaded rank needs
  {g['offload_allocated']:.2f} + {g['free_in_used_segments']:.2f} + {g['context']:.2f} = {kept:.2f} GiB,
  {args.usable_gib - kept:.1f} GiB under the {args.usable_gib:.2f} GiB usable.
- So the {g['offload_total']:.2f} GiB device total is what an unlimited device would hold with
  that slack: an upper bound near the limit, not what the step needs. The fit check
  (`fits`: device total <= device memory) therefore refuses plans like this one that do
  train. The estimator's figures are left unchanged. Not measured: the run's own peak
  reserved and NVML total (the offload launch's results.json records the run's summary).

How this section was made (CPU only; no GPU figure is recomputed):

- command: `{prov['command']}`
- commit: {prov['commit']}
- device: {prov['device']}
- versions: {prov['versions']}
- date: {prov['date']}
"""


if __name__ == "__main__":
    sys.exit(main())
