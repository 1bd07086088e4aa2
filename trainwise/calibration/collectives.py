"""Calibration of collectives: all-reduce, all-gather, reduce-scatter and send/recv
between N local processes (gloo on the CPU, NCCL on GPUs), over message sizes.

`measure_collectives(nproc, device_type, quick)` starts N workers under torchrun (this
module's `main`, the same `python -m torch.distributed.run --standalone` the training
launcher uses) and reads back the Rates rank 0 wrote. Sizes are the bytes each rank sends
under a ring algorithm (the "bus bandwidth" convention): all-reduce of n bytes sends
2 (N-1)/N n, all-gather into (and reduce-scatter from) F bytes sends (N-1)/N F,
send/recv of n bytes sends n. One rate per link then serves every collective."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainwise.calibration.timing import FULL, QUICK, Settings, fit_rate
from trainwise.hardware.profile import COLLECTIVES

CONVENTION = "bytes each rank sends under a ring algorithm (all-reduce 2(N-1)/N x size, " \
             "all-gather and reduce-scatter (N-1)/N x the full size, send/recv the message)"
LAUNCH_TIMEOUT_S = 300


def measure_collectives(nproc: int, device_type: str, quick: bool) -> dict:
    """{"rates": {name: Rate json}, "spread": {name: fraction}, "backend": ...} measured by
    `nproc` local workers. Raises RuntimeError with the workers' last line on failure."""
    with tempfile.TemporaryDirectory(prefix="trainwise-collectives-") as scratch:
        out = Path(scratch) / "collectives.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                   "--nproc-per-node", str(nproc), "-m", "trainwise.calibration.collectives",
                   "--out", str(out), "--device-type", device_type] + (["--quick"] if quick else [])
        # One thread per worker, as the training launcher does: the workers share the cores.
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS",
                                                                str(max(1, (os.cpu_count() or 1) // nproc)))}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=LAUNCH_TIMEOUT_S)
        if done.returncode != 0 or not out.is_file():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"the {nproc}-process collective measurement failed "
                               f"(exit {done.returncode}): {lines[-1] if lines else 'no output'}")
        return json.loads(out.read_text())


def _sizes(device_type: str, settings: Settings) -> list[int]:
    if device_type == "cuda":
        return [2**p for p in range(16, 31, 2)]
    return [2**p for p in ((12, 16, 20) if settings.quick else range(12, 25, 2))]


def _agreed_calls(first_s: float, settings: Settings, device) -> int:
    """Calls per sample, the same on every rank (else the ranks' collectives would not pair)."""
    import torch
    import torch.distributed as dist

    calls = torch.tensor([max(1, min(1000, int(settings.sample_s / max(first_s, 1e-7)) + 1))], device=device)
    dist.all_reduce(calls, op=dist.ReduceOp.MAX)
    return int(calls.item())


def _time_collective(work, sync, settings: Settings, device) -> tuple[float, float]:
    """Median seconds of one call on this rank and the spread, every rank in step."""
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    work()
    sync()
    calls, samples = _agreed_calls(time.perf_counter() - started, settings, device), []
    for _ in range(settings.repeats):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(calls):
            work()
        sync()
        samples.append((time.perf_counter() - started) / calls)
    median = statistics.median(samples)
    return median, (max(samples) - min(samples)) / median


def _works(nbytes: int, world: int, rank: int, device):
    """(name, bytes sent per rank, work) for each collective at `nbytes`."""
    import torch
    import torch.distributed as dist

    n = max(world, nbytes // 4 // world * world)  # fp32 elements, divisible by the ranks
    full, part = torch.ones(n, device=device), torch.ones(n // world, device=device)
    gathered, reduced = torch.empty(n, device=device), torch.empty(n // world, device=device)
    share = (world - 1) / world
    peer = rank ^ 1  # pairs (0, 1), (2, 3), ...; an odd last rank sits send/recv out

    def send_recv():
        if peer < world:
            (dist.send if rank % 2 == 0 else dist.recv)(full, peer)

    return [("all_reduce", 2 * share * n * 4, lambda: dist.all_reduce(full)),
            ("all_gather", share * n * 4, lambda: dist.all_gather_into_tensor(gathered, part)),
            ("reduce_scatter", share * n * 4, lambda: dist.reduce_scatter_tensor(reduced, full)),
            ("send_recv", n * 4, send_recv)]


def _measure(device_type: str, settings: Settings) -> dict:
    import torch
    import torch.distributed as dist

    from trainwise.calibration.timing import synchronizer

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    sync, points = synchronizer(device), {name: [] for name in COLLECTIVES}
    for nbytes in _sizes(device_type, settings):
        for name, sent, work in _works(nbytes, world, rank, device):
            seconds, spread = _time_collective(work, sync, settings, device)
            points[name].append((sent, seconds, spread))
    return {"rates": {name: fit_rate([(x, t) for x, t, _ in p]).to_json() for name, p in points.items()},
            "spread": {name: max(s for _, _, s in p) for name, p in points.items()},
            "points": {name: [[x, t] for x, t, _ in p] for name, p in points.items()},
            "backend": dist.get_backend(), "world_size": world, "convention": CONVENTION}


def main(argv: list[str] | None = None) -> int:
    """A torchrun worker: join the group, time the collectives, rank 0 writes --out."""
    import torch.distributed as dist

    from trainwise.common.atomic import atomic_write_text

    parser = argparse.ArgumentParser(description="one worker of trainwise calibrate --nproc")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device-type", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    dist.init_process_group("nccl" if args.device_type == "cuda" else "gloo")
    try:
        result = _measure(args.device_type, QUICK if args.quick else FULL)
        if dist.get_rank() == 0:
            atomic_write_text(args.out, json.dumps(result, indent=2))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
