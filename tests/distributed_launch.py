"""Run a worker script under torchrun with the gloo backend, on CPU, for the distributed tests.

    result = launch("tests/workers/some_worker.py", nproc=2, args=["--layout", "ddp"], tmp_path=tmp_path)
    result.rank_outputs[0]  # what rank 0 wrote with `write_result` (a JSON object)

Each launch costs a few seconds of imports per process on a 2-core machine, so a worker
should check several things per launch rather than one launch per assertion.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT_DIR_VARIABLE = "TRAINWISE_TEST_RESULT_DIR"
# Trains each case of a JSON list with trainwise.api.train on every rank and writes each
# case's loss curve (or its error), state bytes and measured peak: one launch, many cases.
CASES_WORKER = "tests/workers/parallel_engine_worker.py"


@dataclass
class Launch:
    returncode: int
    stdout: str
    stderr: str
    rank_outputs: dict[int, dict]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(script: str | Path, nproc: int, tmp_path: Path, args: list[str] = (), timeout_s: float = 240,
           extra_env: dict[str, str] | None = None) -> Launch:
    """torchrun `script` on `nproc` local CPU processes; never hangs past `timeout_s`."""
    results = Path(tmp_path) / f"results-{free_port()}"
    results.mkdir(parents=True)
    env = {**os.environ, RESULT_DIR_VARIABLE: str(results), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "",
           # the repository first; what the caller's path adds stays (torchao in make test's float8 pass)
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
           **(extra_env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    outputs = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in results.glob("rank-*.json")}
    return Launch(done.returncode, done.stdout, done.stderr, outputs)


def write_result(payload: dict) -> None:
    """Called inside a worker: save this rank's JSON result for the test to read."""
    rank = int(os.environ.get("RANK", "0"))
    directory = Path(os.environ[RESULT_DIR_VARIABLE])
    temporary = directory / f".rank-{rank}.json.tmp"
    temporary.write_text(json.dumps(payload))
    temporary.rename(directory / f"rank-{rank}.json")
