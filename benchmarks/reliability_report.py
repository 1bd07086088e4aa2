"""docs/reliability.md: every fault and bad input the test suite injects, what trainwise
said, its exit code, and what was lost (measured: the files there before the fault, or
written by a completed save, that are missing or changed after it; must be 0).

    python benchmarks/reliability_report.py                    # writes docs/reliability.md
    python benchmarks/reliability_report.py --out /tmp/r.md

Runs the tests marked `fault` (pytest -m fault) in a fresh process with TRAINWISE_FAULT_LOG
set; each of them records its cases through the `fault_log` fixture after its assertions
passed (tests/fault_log.py). Nothing is written unless every one of those tests passed, so
the page can only show what the suite really checked on this commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from trainwise.common.atomic import atomic_write_text  # noqa: E402

REPO = provenance.REPO


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "reliability.md"))
    args = parser.parse_args(argv)
    prov = provenance.collect(provenance.script_command("reliability_report.py", argv or sys.argv[1:]))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "faults.json"
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "fault", "-q", "-p", "no:cacheprovider",
                               "tests"], cwd=REPO, env={**os.environ, "TRAINWISE_FAULT_LOG": str(log)})
        if done.returncode != 0:
            print(f"reliability_report: pytest -m fault exited {done.returncode}; nothing written", file=sys.stderr)
            return 1
        records = json.loads(log.read_text()) if log.is_file() else []
    if not records:
        print("reliability_report: the fault tests recorded nothing; nothing written", file=sys.stderr)
        return 1
    prov = {**provenance.finish(prov),
            "extra": {"time": f"{time.perf_counter() - started:.0f} s (measured) to run the fault tests"}}
    atomic_write_text(args.out, render(records, prov))
    print(f"wrote {args.out}: {len(records)} cases")
    return 0


def render(records: list[dict], prov: dict) -> str:
    """The page: provenance, totals, then one table per kind."""
    kinds = Counter(r["kind"] for r in records)
    lost, watched = sum(r["lost"] for r in records), sum(r["watched"] for r in records)
    lines = ["Every row is a case a test marked `fault` tried (`pytest -m fault`); the test records it "
             "(`tests/fault_log.py`) only after its assertions passed, and this page is written only when "
             "every such test passed.", "",
             "## Totals", "",
             f"- Faults injected: {kinds['fault']}",
             f"- Bad inputs tried: {kinds['bad input']}",
             f"- Files lost: {lost} of the {watched} that the cases watched (measured: each file there before "
             "the fault, or listed by a save that completed before it, checked by sha256 after it)", "",
             "Exit codes: 0 success; 1 an unexpected error; 2 bad input (one line naming the field, before any "
             "long work); 3 out of memory; 4 a checkpoint or result could not be written (what was there is "
             "intact); 128 + N stopped by signal N after saving (see docs/train.md).", "",
             "Checkpoints: a checkpoint's manifest is written last, and `--resume` falls back past a damaged "
             "checkpoint to the previous intact one. Asynchronous saves (`--checkpoint-async`, runs of several "
             "processes) write in the background while training goes on, one at a time; the manifest and the "
             "rename into place wait until every rank's shards are on disk, so a job killed with a save in flight "
             "resumes from the previous complete checkpoint. Their cost: a host-memory copy of each rank's shards "
             "while a save is in flight (docs/train.md).", ""]
    for kind, title in (("fault", "Faults"), ("bad input", "Bad inputs")):
        rows = [r for r in records if r["kind"] == kind]
        lines += [f"## {title} ({len(rows)})", "", "| case | exit code | what trainwise said | files lost (of watched) | test |",
                  "| --- | --- | --- | --- | --- |"]
        for r in sorted(rows, key=lambda r: (r["test"], r["case"])):
            code = "" if r["exit_code"] is None else str(r["exit_code"])
            lines.append(f"| {_cell(r['case'])} | {code} | {_cell(r['message'])} | {r['lost']} of {r['watched']} | "
                         f"`{r['test'].split('::')[0]}` |")
        lines.append("")
    return provenance.page("Reliability: faults injected and bad inputs tried", prov, "\n".join(lines))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.exit(main())
