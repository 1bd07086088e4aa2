"""How far a timing can be trusted: whether other work shares the machine, how much
repeated timings of the same thing spread, and a ratio of two timings given only when
both are steady and the machine was quiet.

Every command and script that times (bench, verify, calibrate, the benchmarks/ scripts)
uses these, so "busy", "spread" and "confident" mean one thing everywhere:

- busy: the CPU time other processes use in the second before the timing (the machine's
  busy time from /proc/stat, this process tree's own and steal by the host included, less
  this tree's own) leaves fewer CPUs than the timing needs, with half a CPU of slack; on a
  GPU, another process holds a context on it or it is already working. Not the 1-minute
  load average: it still counts, for a minute, a run that has ended (a benchmark's own
  previous run, a `calibrate` just before), so a quiet machine read busy after every run.
  Where /proc/stat is not there, the load average less this tree's own recent CPU use.
- spread: (max - min) / median of the samples; with 5 or more samples the single fastest
  and slowest are left out first, so one stray sample (a garbage-collector pause) does
  not decide it alone but a machine that keeps interfering does.
- a ratio of two Spreads' medians is confident when both spreads are at most 10 % and the
  machine was not busy; otherwise the reason takes its place."""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

from trainwise.common.nvml import nvml_session

SPREAD_LIMIT = 0.10  # a fraction: above it, two timings' ratio is not shown
TRIM_FROM = 5  # with this many samples or more, the fastest and slowest are left out of the spread
IDLE_SLACK_CPUS = 0.5  # background load tolerated beside a timing, in CPUs
GPU_BUSY_UTILISATION = 10  # %, NVML's utilisation before a run above which another job is running
LOAD_WINDOW_S = 60.0  # the time constant of the kernel's 1-minute load average
SAMPLE_S = 1.0  # the window in which other processes' CPU use is measured before a timing


@dataclass(frozen=True)
class Spread:
    """Repeated timings of one thing (any unit: seconds per step, samples/s), kept whole."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, values) -> "Spread":
        """The finite positive values of `values` (a failed run's None is left out)."""
        return cls(tuple(float(v) for v in values
                         if isinstance(v, (int, float)) and math.isfinite(v) and v > 0))

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def low(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def high(self) -> float | None:
        return max(self.samples) if self.samples else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median as a fraction, the extremes trimmed from TRIM_FROM samples
        on; None with fewer than two samples (nothing to compare)."""
        if self.n < 2:
            return None
        kept = sorted(self.samples)[1:-1] if self.n >= TRIM_FROM else sorted(self.samples)
        return (kept[-1] - kept[0]) / statistics.median(self.samples)

    def to_json(self) -> dict:
        spread = self.spread
        return {"n": self.n, "median": self.median, "min": self.low, "max": self.high,
                "spread_pct": None if spread is None else round(100 * spread, 1), "samples": list(self.samples)}


def spread_text(spread: float | None) -> str:
    return "n/a" if spread is None else f"{100 * spread:.0f} %"


def _beside(spread: float, threshold: float) -> str:
    """A spread shown next to the threshold it exceeds: with a decimal when whole percents
    would read as equal to it ("10.4 % > 10 %", not "10 % > 10 %")."""
    text = spread_text(spread)
    return f"{100 * spread:.1f} %" if text == spread_text(threshold) else text


@dataclass(frozen=True)
class Ratio:
    """a's median / b's median, or (value None) the reason it is withheld."""

    value: float | None
    withheld: str | None = None

    def text(self) -> str:
        return f"{self.value:.2f}x" if self.value is not None else f"not shown: {self.withheld}"

    def to_json(self) -> dict:
        return {"ratio": None if self.value is None else round(self.value, 3), "withheld": self.withheld}


def confident_ratio(a: Spread, b: Spread, threshold: float = SPREAD_LIMIT, busy: str | None = None) -> Ratio:
    """a.median / b.median when both have at least two samples spreading by at most
    `threshold` (a fraction) and `busy` (what busy_machine() said while they were
    measured) is None; otherwise a Ratio carrying the first reason found."""
    if busy:
        return Ratio(None, busy)
    if a.median is None or b.median is None:
        return Ratio(None, "a timing is missing")
    if a.n < 2 or b.n < 2:
        return Ratio(None, "one sample: no spread to judge it by")
    worst = max(a.spread, b.spread)
    if worst > threshold:
        return Ratio(None, f"spread {_beside(worst, threshold)} > {spread_text(threshold)}")
    return Ratio(a.median / b.median)


def busy_machine(device: str = "cpu", needs_cpus: float | None = None) -> str | None:
    """Why a timing taken now would be disturbed ("machine busy: load 5.2 on 2 CPUs, ...")
    or None. `needs_cpus`: the CPUs the timed work uses (default: all usable ones, as
    torch on a CPU does; about 1 for work that runs on a GPU). Call it between runs: the
    CPU use of children still running is not yet counted as this process tree's own."""
    reason = _cpu_reason(needs_cpus)
    if reason is None and str(device).startswith("cuda"):
        reason = _gpu_reason()
    return reason


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_reason(needs_cpus: float | None) -> str | None:
    cpus = usable_cpus()
    needs = cpus if needs_cpus is None else min(needs_cpus, cpus)
    others = _others_now(SAMPLE_S)
    if others is not None:
        if others <= cpus - needs + IDLE_SLACK_CPUS:
            return None
        return (f"machine busy: other processes used {others:.1f} of {cpus} CPU{'s' if cpus != 1 else ''} "
                f"in the {SAMPLE_S:g} s before the run")
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None  # no load average on this system: only the spread can tell
    others = max(0.0, load - _OWN_LOAD.now())
    if others <= cpus - needs + IDLE_SLACK_CPUS:
        return None
    return (f"machine busy: load {load:.1f} on {cpus} CPU{'s' if cpus != 1 else ''}, "
            f"about {others:.1f} of it from other processes")


def _others_now(window_s: float) -> float | None:
    """CPUs' worth of work other processes did over the next `window_s` seconds (call it
    between runs); None where /proc/stat cannot be read."""
    before = cpu_probe()
    if before is None:
        return None
    time.sleep(window_s)
    return others_cpus_since(before)


def cpu_probe() -> dict | None:
    """The machine's busy CPU seconds since boot and this process tree's (its finished
    children included), now; None where /proc/stat cannot be read."""
    busy = machine_busy_s()
    return None if busy is None else {"machine_busy_s": busy, "own_cpu_s": own_cpu_s(), "at": time.monotonic()}


def others_cpus_since(before: dict | None) -> float | None:
    """CPUs' worth of work other processes did on average since the probe `before`: the
    machine's busy time (/proc/stat: user, nice, system, irq, softirq, steal) less this
    process tree's own, over the wall time between."""
    after = cpu_probe()
    if before is None or after is None or after["at"] <= before["at"]:
        return None
    other = (after["machine_busy_s"] - before["machine_busy_s"]) - (after["own_cpu_s"] - before["own_cpu_s"])
    return max(0.0, other) / (after["at"] - before["at"])


def machine_busy_s() -> float | None:
    """Seconds every CPU of the machine has spent busy since boot (/proc/stat's first line)."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class _OwnLoad:
    """This process tree's contribution to the 1-minute load average, estimated from its
    CPU time (its own and its finished children's, os.times) between calls, weighted as
    the kernel weights the load average (exponentially, time constant 60 s)."""

    def __init__(self):
        self.samples = [self._sample()]

    @staticmethod
    def _sample() -> tuple[float, float]:
        t = os.times()
        return time.monotonic(), t.user + t.system + t.children_user + t.children_system

    def now(self) -> float:
        self.samples = [s for s in self.samples if s[0] > time.monotonic() - 10 * LOAD_WINDOW_S]
        self.samples.append(self._sample())
        end = self.samples[-1][0]
        load = 0.0
        for (t0, cpu0), (t1, cpu1) in zip(self.samples, self.samples[1:]):
            if t1 > t0:
                weight = math.exp(-(end - t1) / LOAD_WINDOW_S) - math.exp(-(end - t0) / LOAD_WINDOW_S)
                load += (cpu1 - cpu0) / (t1 - t0) * weight
        return load


_OWN_LOAD = _OwnLoad()


def _gpu_reason() -> str | None:
    """Another process on a visible GPU, or a GPU already working, as NVML reports it
    (None without NVML). A process NVML lists under a pid this tree does not know (a
    container can hide the host's pids) counts as another's: call it between runs."""
    with nvml_session() as pynvml:
        if pynvml is None:
            return None
        try:
            ours = _own_pids()
            for index, handle in _visible_gpus(pynvml):
                others = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid not in ours]
                if others:
                    return f"GPU busy: GPU {index} is used by other processes (pid {', '.join(map(str, others[:3]))})"
                utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                if utilisation > GPU_BUSY_UTILISATION:
                    return f"GPU busy: GPU {index} was {utilisation} % utilised before the run"
        except Exception:  # noqa: BLE001 - a query this driver does not support
            return None
    return None


def _visible_gpus(pynvml) -> list[tuple[int, object]]:
    """(NVML index, handle) of the GPUs CUDA_VISIBLE_DEVICES lets this process use (all
    when it is unset): a busy GPU next to ours does not disturb our timing."""
    gpus = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    wanted = {v.strip() for v in visible.split(",") if v.strip()}

    def uuid(handle) -> str:
        value = pynvml.nvmlDeviceGetUUID(handle)
        return value.decode() if isinstance(value, bytes) else str(value)

    uuids = [w for w in wanted if w.startswith("GPU-")]
    return [(i, h) for i, h in gpus if str(i) in wanted or any(uuid(h).startswith(w) for w in uuids)]


def _own_pids() -> set[int]:
    """This process and its descendants (from /proc; just this process elsewhere)."""
    parents: dict[int, int] = {}
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
    except OSError:
        pass
    ours, grew = {os.getpid()}, True
    while grew:
        grown = ours | {pid for pid, parent in parents.items() if parent in ours}
        grew, ours = len(grown) > len(ours), grown
    return ours
