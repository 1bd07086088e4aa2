"""Watching a local torchrun job from the `trainwise train --nproc N` process.

torchrun's stderr (its own log and the workers') is passed through line by line; its
report of a failed worker ("failed (exitcode: -9) local_rank: 1 ...", logged once every
worker of the attempt has stopped) becomes one line for the user: which rank failed and
what happens next (restart k of R from step S), or, when the job ends, a last error line
naming the rank and the step `--resume` would continue from.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainwise.engine.checkpoint import latest_checkpoint
from trainwise.engine.preemption import exit_code_after, relaying_stop_signals, start_relaying_child
from trainwise.engine.parallel.restarts import JOB_STARTED, checkpoint_step, checkpoint_to_continue, restart_line
from trainwise.engine.run_config import RunConfig

# torchrun's line for the first worker that failed in an attempt (local rank = rank on one node).
_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
# After the job's end, how long the output of leftover grandchildren is waited for (seconds).
_RELAY_DRAIN_S = 10.0


class FailureWatcher:
    """Counts the failed attempts of one job and words what follows each."""

    def __init__(self, run: RunConfig, started_ns: int):
        self.run, self.started_ns = run, started_ns
        self.failures: list[str] = []

    def see(self, line: str) -> str | None:
        """The restart line for a torchrun failure report, else None."""
        match = _FAILURE.search(line)
        if match is None:
            return None
        self.failures.append(_who_failed(int(match.group(2)), int(match.group(1))))
        attempt = len(self.failures)
        if attempt > self.run.max_restarts:
            return None  # the job ends: `final_line` speaks after torchrun's own report
        return restart_line(attempt, self.run.max_restarts, self._continue_from(), self.failures[-1])

    def final_line(self) -> str | None:
        """The error line for a job that ended on a failure, or None when none was seen."""
        if not self.failures:
            return None
        count = self.run.max_restarts
        after = f" after {count} restart{'s' if count > 1 else ''}" if count else ""
        line = f"trainwise: error: {self.failures[-1]}{after}; the job stopped"
        checkpoint = latest_checkpoint_of(self.run)
        if checkpoint is not None:
            line += f" (--resume continues from step {checkpoint_step(checkpoint)})"
        return line

    def _continue_from(self) -> Path | None:
        if not self.run.output:
            return None
        return checkpoint_to_continue(self.run.output, self.run.resume, self.started_ns)


def latest_checkpoint_of(run: RunConfig) -> Path | None:
    return latest_checkpoint(run.output) if run.output else None


def watch_job(command: list[str], env: dict, run: RunConfig, notice: Path | None = None) -> int:
    """Run torchrun `command`; its exit code (128 + a stop signal relayed to it, see
    trainwise.engine.preemption; `notice`: where the workers write a stop agreed with other
    nodes). Restarts and the failing rank are announced on stderr, one line each."""
    started_ns = time.time_ns()
    watcher = FailureWatcher(run, started_ns)
    with start_relaying_child(command, {**env, JOB_STARTED: str(started_ns)}, stderr=subprocess.PIPE) as process:
        relay = threading.Thread(target=_relay, args=(process.stderr, watcher), daemon=True)
        relay.start()
        try:
            with relaying_stop_signals(process, notice) as relayed:  # SIGTERM, SIGINT, SIGUSR1 reach every worker
                code = process.wait()
        except BaseException:
            process.kill()  # as subprocess.run does when interrupted
            raise
        relay.join(timeout=_RELAY_DRAIN_S)
    final = watcher.final_line() if code != 0 and not relayed else None
    if final:
        print(final, file=sys.stderr, flush=True)
    return exit_code_after(code, relayed)


def _relay(stream, watcher: FailureWatcher) -> None:
    for raw in iter(stream.readline, b""):
        _write(raw)
        announcement = watcher.see(raw.decode(errors="replace"))
        if announcement:
            _write((announcement + "\n").encode())


def _write(data: bytes) -> None:
    target = getattr(sys.stderr, "buffer", None)
    if target is not None:
        target.write(data)
    else:
        sys.stderr.write(data.decode(errors="replace"))
    sys.stderr.flush()


def _who_failed(rank: int, exit_code: int) -> str:
    """`rank 1 failed (killed by SIGKILL)` / `rank 1 failed (exit code 1)`."""
    if exit_code < 0:
        try:
            how = f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            how = f"killed by signal {-exit_code}"
    else:
        how = f"exit code {exit_code}"
    return f"rank {rank} failed ({how})"
