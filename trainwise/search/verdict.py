"""The verdict of a verify run: which plan to recommend, and how sure the measurement is.

Plans are compared by measured seconds per sample (step time / samples per optimizer
step), which orders plans of one global batch exactly as their step times do and stays
fair if the batches differ. The measured best is recommended. It is declared the winner
only when it can be told from every other plan that ran: with two or more runs each,
their ranges of run times must not overlap and neither plan's spread may exceed
NOISE_LIMIT; with one run each (no spread measured), the gap must exceed NOISE_LIMIT.
A busy machine is never confident."""

from __future__ import annotations

from dataclasses import replace

from trainwise.plan.layout import resolve_layout

# Run-to-run spread above which a timing is not trusted, and the gap two single runs
# must exceed to be told apart (what the bench treats as noise on a shared machine).
NOISE_LIMIT = 0.10


def decide(report):
    """`report` (a VerifyReport) with recommended, predicted_best, confident and lines set."""
    entries = report.entries
    predicted_best = max(range(len(entries)), key=lambda i: (entries[i].candidate.samples_per_s, -i))
    ran = [i for i, entry in enumerate(entries) if entry.status == "ok" and entry.measured_runs_s]
    if not ran:
        lines = (f"no plan ran on {report.device_name}: nothing to recommend (see each plan's status)",)
        return replace(report, predicted_best=predicted_best, recommended=None, confident=False, lines=lines)
    best = min(ran, key=lambda i: (_per_sample(entries[i]), i))
    tied = [i for i in ran if i != best and indistinguishable(entries[best], entries[i])]
    lines = [_recommendation(entries, best, tied, ran)]
    lines += _against_prediction(entries, best, predicted_best)
    if report.busy:
        lines.append(f"not a confident pick: {report.busy}; rerun on an idle machine")
    confident = not tied and not report.busy and not _too_noisy(entries[best])
    return replace(report, predicted_best=predicted_best, recommended=best, confident=confident, lines=tuple(lines))


def indistinguishable(first, second) -> bool:
    """True when the measured times of two plans cannot be told apart (see the module)."""
    a, b = _per_sample_runs(first), _per_sample_runs(second)
    if len(a) >= 2 and len(b) >= 2:
        overlap = min(a) <= max(b) and min(b) <= max(a)
        return overlap or _too_noisy(first) or _too_noisy(second)
    fast, slow = sorted((_per_sample(first), _per_sample(second)))
    return (slow - fast) / fast <= NOISE_LIMIT


def samples_per_step(candidate) -> int:
    """Samples per optimizer step over all data-parallel ranks."""
    return candidate.plan.global_batch_per_device * resolve_layout(candidate.plan).data_parallel


def _recommendation(entries, best: int, tied: list[int], ran: list[int]) -> str:
    chosen = entries[best]
    line = (f"recommended: #{chosen.rank}, the measured best ({chosen.measured_step_s:.3f} s/step, "
            f"{_per_sample(chosen):.4f} s/sample measured, {_spread_text(chosen)})")
    if not tied:
        others = [i for i in ran if i != best]
        if not others:
            return line
        nearest = min(others, key=lambda i: _per_sample(entries[i]))
        return (f"{line}; the next, #{entries[nearest].rank}, measured "
                f"{_slower_pct(entries[nearest], chosen):+.1f} % time per sample, beyond the run-to-run spread")
    others = ", ".join(f"#{entries[i].rank} ({_slower_pct(entries[i], chosen):+.1f} %, {_spread_text(entries[i])})"
                       for i in tied)
    return (f"{line}; no clear winner: it cannot be told apart from {others} (their run times overlap, "
            f"a spread is over {NOISE_LIMIT:.0%}, or single runs are within {NOISE_LIMIT:.0%}); "
            "more runs (--verify-repeat) on an idle machine may separate them")


def _against_prediction(entries, best: int, predicted_best: int) -> list[str]:
    """How the measured order differs from the predicted one."""
    if best == predicted_best:
        return [f"the measured best is the predicted best (#{entries[best].rank})"]
    expected = entries[predicted_best]
    if expected.status != "ok":
        return [f"the predicted best #{expected.rank} did not run here ({expected.status}: {expected.message})"]
    return [f"the measured best #{entries[best].rank} differs from the predicted best #{expected.rank}: "
            f"#{expected.rank} measured {_slower_pct(expected, entries[best]):+.1f} % time per sample"]


def _per_sample_runs(entry) -> list[float]:
    per_step = samples_per_step(entry.candidate)
    return [seconds / per_step for seconds in entry.measured_runs_s]


def _per_sample(entry) -> float:
    return entry.measured_step_s / samples_per_step(entry.candidate)


def _slower_pct(entry, reference) -> float:
    """How much more time per sample `entry` measured than `reference`, in %."""
    return 100.0 * (_per_sample(entry) / _per_sample(reference) - 1.0)


def _too_noisy(entry) -> bool:
    return entry.spread is not None and entry.spread > NOISE_LIMIT


def _spread_text(entry) -> str:
    if entry.spread is None:
        return "one run, spread not measured"
    return f"spread {100 * entry.spread:.1f} % over {len(entry.measured_runs_s)} runs"
