"""docs/results/layout-equality-cpu.md: does each parallel layout train the same model as one process?

    python benchmarks/layout_equality.py                      # every case, ~10 min on 2 cores
    python benchmarks/layout_equality.py --only "2 nodes"     # cases whose name contains a part

Each case is a real `trainwise train` launch on this machine's CPU (gloo): `--nproc G` on one
node, or two launchers on localhost joined by a c10d rendezvous (`--nnodes 2 --node-rank R
--rdzv-endpoint 127.0.0.1:PORT`), which is how trainwise starts a job of several nodes. Its
loss curve is compared, step by step, with one process training the same samples per step
(accumulation takes the place of the data-parallel ranks; tensor- and pipeline-parallel
peers share their samples): the largest relative difference over the steps, against the
1e-4 the tests hold. Dropout is set to 0 in the configs (a split layer draws its masks
differently from one process), and the data is synthetic with one seed. Nothing here is
timed but the launches' wall seconds, which are shown only to say what a case costs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from trainwise.common.atomic import atomic_write_text  # noqa: E402

TOLERANCE = 1e-4
STEPS = 10
BASE = ["--device", "cpu", "--data", "synthetic", "--batch-size", "2", "--seq-len", "32", "--lr", "1e-3"]
NO_DROPOUT = {"tiny-llama": {}, "tiny-gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
              "tiny-bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}}
SP = ["--sequence-parallel"]
PP2 = ["--pp", "2", "--microbatches", "2"]


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    flags: list[str]
    ranks_per_node: int
    nodes: int = 1
    config: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.ranks_per_node * self.nodes

    def task(self) -> list[str]:
        """The --task flag the case gives, which its one-process reference must give too."""
        return self.flags[self.flags.index("--task"):self.flags.index("--task") + 2] if "--task" in self.flags else []

    def data_parallel(self) -> int:
        def degree(flag: str) -> int:
            return int(self.flags[self.flags.index(flag) + 1]) if flag in self.flags else 1
        return self.world // (degree("--tp") * degree("--pp"))


CASES = [
    Case("ZeRO-3 2", "tiny-llama", ["--zero", "3"], 2),
    Case("PP 2", "tiny-llama", PP2, 2),
    Case("TP 2 + SP, Llama", "tiny-llama", ["--tp", "2", *SP], 2),
    Case("TP 2 + SP, GPT-2", "tiny-gpt2", ["--tp", "2", *SP], 2),
    Case("TP 2 + SP, BERT", "tiny-bert", ["--task", "seq-cls", "--tp", "2", *SP], 2),
    Case("TP 2, BERT masked-lm", "tiny-bert", ["--task", "masked-lm", "--tp", "2"], 2),
    Case("TP 2 + SP x PP 2, Llama", "tiny-llama", ["--tp", "2", *SP, *PP2], 4),
    Case("TP 2 + SP x PP 2, GPT-2", "tiny-gpt2", ["--tp", "2", *SP, *PP2], 4),
    Case("ZeRO-3 2 x TP 2 + SP x PP 2, Llama", "tiny-llama", ["--zero", "3", "--tp", "2", *SP, *PP2], 8),
    Case("2 nodes: ZeRO-3 4", "tiny-llama", ["--zero", "3"], 2, nodes=2),
    Case("2 nodes: TP 2 + SP x ZeRO-3 2", "tiny-llama", ["--tp", "2", *SP, "--zero", "3"], 2, nodes=2),
    Case("2 nodes: PP 2 x DP 2", "tiny-llama", PP2, 2, nodes=2),
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated parts of case names")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per launch")
    parser.add_argument("--page", type=Path, default=provenance.REPO / "docs" / "results" / "layout-equality-cpu.md")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(part in c.name for part in args.only.split(","))]
    prov = provenance.collect(provenance.script_command("layout_equality.py", argv))
    rows, references = [], {}
    with tempfile.TemporaryDirectory(prefix="layout-equality-") as scratch:
        for case in cases:
            model = model_dir(case.model, Path(scratch))
            key = (case.model, case.data_parallel(), *case.task())
            if key not in references:
                reference = Case("one process", case.model, [*case.task(), "--grad-accum", str(key[1])], 1)
                references[key] = run_case(reference, model, Path(scratch), args.timeout)
            got = run_case(case, model, Path(scratch), args.timeout)
            rows.append(compare(case, got, references[key]))
            print(json.dumps(rows[-1]), flush=True)
    atomic_write_text(args.page, provenance.page("Parallel layouts against one process (CPU, gloo)",
                                                 provenance.finish(prov), render(rows)))
    print(f"wrote {args.page}")
    return 0 if all(r["verdict"] == "equal" for r in rows) else 1


def model_dir(name: str, scratch: Path) -> Path:
    """The catalog model's config with dropout off, as a model directory."""
    from trainwise.models import resolve_model

    folder = scratch / f"{name}-no-dropout"
    if not folder.exists():
        config = resolve_model(name).config.to_dict()
        config.update(NO_DROPOUT[name])
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def run_case(case: Case, model: Path, scratch: Path, timeout: float) -> dict:
    """{"losses": [...], "seconds": wall} or {"error": the last line the launch printed}."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    common = [sys.executable, "-m", "trainwise", "train", str(model), *BASE, "--steps", str(STEPS), *case.flags,
              "--metrics", str(out / "metrics.jsonl")]
    if case.nodes == 1:
        commands = [[*common, "--nproc", str(case.ranks_per_node), "--output", str(out / "run")]]
    else:
        endpoint = f"127.0.0.1:{free_port()}"
        commands = [[*common, "--nproc", str(case.ranks_per_node), "--nnodes", str(case.nodes), "--node-rank", str(rank),
                     "--rdzv-endpoint", endpoint, "--output", str(out / "run")] for rank in range(case.nodes)]
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(provenance.REPO)}
    launches = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                for command in commands]
    outputs, codes = [], []
    for launch in launches:
        try:
            outputs.append(launch.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for other in launches:
                other.kill()
            return {"error": f"no result within {timeout:.0f} s"}
        codes.append(launch.returncode)
    seconds = time.perf_counter() - started
    if any(codes) or not (out / "metrics.jsonl").exists():
        lines = [line for text in outputs for line in text.splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
        return {"error": f"exit {max(codes)}: {said.strip()[:300]}"}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"losses": [line["loss"] for line in metrics if "step" in line], "seconds": seconds}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def compare(case: Case, got: dict, reference: dict) -> dict:
    row = {"name": case.name, "model": case.model, "ranks": case.world, "nodes": case.nodes,
           "flags": " ".join(case.flags), "reference": f"--grad-accum {case.data_parallel()}"}
    if "error" in got or "error" in reference:
        return {**row, "verdict": "did not run", "why": got.get("error") or f"one process: {reference['error']}"}
    if len(got["losses"]) != len(reference["losses"]):
        return {**row, "verdict": "differs", "why": f"{len(got['losses'])} steps against {len(reference['losses'])}"}
    worst = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], reference["losses"]))
    return {**row, "max_relative": worst, "steps": len(got["losses"]), "seconds": got["seconds"],
            "verdict": "equal" if worst <= TOLERANCE else "differs"}


def render(rows: list[dict]) -> str:
    equal = sum(r["verdict"] == "equal" for r in rows)
    lines = [f"{equal} of {len(rows)} layouts trained the same loss curve as one process (largest relative "
             f"difference over {STEPS} steps <= {TOLERANCE:g}). Each case is a fresh `trainwise train` launch "
             "on CPU with gloo; the one-process reference trains the same samples per step with the accumulation "
             "shown. Batch per rank 2, sequence 32 tokens, learning rate 1e-3, synthetic data, dropout 0. "
             "Wall seconds are the launch's, startup included (measured on a 2-core machine: what a case costs, "
             "not a speed figure).", "",
             "| layout | model | ranks | nodes | flags | reference | largest relative difference (measured) | "
             "verdict | wall s (measured) |",
             "| --- | --- | ---: | ---: | --- | --- | ---: | --- | ---: |"]
    for r in rows:
        worst = f"{r['max_relative']:.1e}" if "max_relative" in r else "-"
        seconds = f"{r['seconds']:.0f}" if "seconds" in r else "-"
        verdict = r["verdict"] + (f": {r['why']}" if r.get("why") else "")
        lines.append(f"| {r['name']} | {r['model']} | {r['ranks']} | {r['nodes']} | `{r['flags']}` | "
                     f"`{r['reference']}` | {worst} | {verdict} | {seconds} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
