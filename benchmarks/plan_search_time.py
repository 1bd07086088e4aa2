"""How long `trainwise plan` takes on this machine's CPU, and how much memory it holds:
docs/results/plan-search-cpu.md.

Three cases, each `python -m trainwise plan ... --json` in a fresh process (no verify):

    8B-1gpu     Llama-3.1-8B on one H100, --allow lora          target 30 s
    70B-64gpu   Llama-3.1-70B on 64 H100, 8 per node           target 60 s
    405B-1024gpu Llama-3.1-405B on 1024 H100, 8 per node       target 120 s

For each run: wall seconds, CPU seconds (user + system, from the child's own rusage, as
/usr/bin/time reports them), peak resident memory (target <= 4 GB), the search's own
seconds as it reports them (after the imports), the plans screened and estimates run, and
the best plan or the refusal. `--repeat R` runs every case R times (median, and the spread
(max - min) / median when R > 1). The 1-minute load average is recorded before each run:
on a shared machine wall times are inflated; CPU seconds much less so.

    python benchmarks/plan_search_time.py [--repeat 1] [--cases 70B-64gpu,...] [--page FILE]

Exits 1 when a case misses a target (wall or CPU seconds, or memory).
"""

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

import provenance

provenance.add_repo_to_path()

from trainwise.common.atomic import atomic_write_text  # noqa: E402

TARGET_BYTES = 4 * 10 ** 9
PLAN = ["--device", "H100", "--seq-len", "2048"]
# name: (plan arguments, target seconds)
CASES = {
    "8B-1gpu": (["Llama-3.1-8B", *PLAN, "--global-batch", "64", "--allow", "lora"], 30.0),
    "70B-64gpu": (["Llama-3.1-70B", *PLAN, "--gpus", "64", "--gpus-per-node", "8", "--global-batch", "512"], 60.0),
    "405B-1024gpu": (["Llama-3.1-405B", *PLAN, "--gpus", "1024", "--gpus-per-node", "8", "--global-batch", "2048"],
                     120.0),
}
DEFAULT_PAGE = provenance.REPO / "docs" / "results" / "plan-search-cpu.md"


def run_once(arguments: list[str]) -> dict:
    """One `trainwise plan` process: wall, CPU seconds and peak RSS from its own rusage
    (os.wait4, as /usr/bin/time reads them); its output goes through files, not pipes."""
    load = provenance.load_average()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "trainwise", "plan", *arguments, "--json"], stdout=out,
                                 stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    row = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024,
           "exit": child.returncode, "load_before": load}  # Linux reports ru_maxrss in KiB
    if child.returncode == 0:
        data = json.loads(stdout)
        best = data["plans"][0]
        row.update(search_s=data["search_s"], screened=data["screened"], estimates=data["estimates"],
                   best=best["flags"], best_step_s=best["step_s"], best_mfu=best["mfu"])
    else:
        row["refused"] = (stderr.strip().splitlines() or ["(no message)"])[-1]
    return row


def summary(name: str, runs: list[dict], target: float) -> dict:
    """Median (and spread when several runs) of a case, and whether it met its targets."""
    def median(key):
        return statistics.median(r[key] for r in runs)

    def spread(key):
        values = [r[key] for r in runs]
        return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 and median(key) else None
    wall, cpu, rss = median("wall_s"), median("cpu_s"), max(r["peak_rss_bytes"] for r in runs)
    met = all(r["exit"] in (0, 2) for r in runs) and wall <= target and cpu <= target and rss <= TARGET_BYTES
    return {"case": name, "target_s": target, "wall_s": wall, "cpu_s": cpu, "wall_spread": spread("wall_s"),
            "cpu_spread": spread("cpu_s"), "peak_rss_bytes": rss, "met": met, "last": runs[-1]}


def page_body(rows: list[dict], repeat: int, busy: bool) -> str:
    """The page's text; `busy`: other processes shared the CPU during the runs (provenance's
    verdict, from the CPU seconds they used), which the page says, and only then."""
    machine = ("**The machine was shared** with other work while this ran (see the machine load above): wall times "
               "are inflated by waiting for a core; CPU seconds much less so." if busy else
               "Nothing else used the CPU while this ran (see the machine load above).")
    lines = ["Each case is `python -m trainwise plan <arguments> --json` in a fresh process, without verify, "
             f"{repeat} run(s) each (median; spread = (max - min) / median over the runs). Wall and CPU seconds "
             "are the whole process's (Python and torch imports included); the search's own seconds are what "
             "the JSON reports. CPU seconds are user + system time of the process.",
             "",
             f"{machine} The targets are for 2 quiet cores, on both wall and CPU seconds; a case is marked not met "
             "when either is over, busy machine or not. The CPU model is in the device line: the same search "
             "takes about twice as long on some CPUs this project ran on as on others.",
             "",
             "| case | target | wall (s) | CPU (s) | search (s, own) | peak RSS (GB) | load before | screened | "
             "estimates | met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        last = row["last"]
        spread = "" if row["wall_spread"] is None else (f" ±{100 * row['wall_spread']:.0f} %")
        cpu_spread = "" if row["cpu_spread"] is None else (f" ±{100 * row['cpu_spread']:.0f} %")
        lines.append(f"| {row['case']} | {row['target_s']:.0f} s, 4 GB | {row['wall_s']:.1f}{spread} | "
                     f"{row['cpu_s']:.1f}{cpu_spread} | {last.get('search_s', float('nan')):.1f} | "
                     f"{row['peak_rss_bytes'] / 1e9:.2f} | {last['load_before']} | {last.get('screened', '-')} | "
                     f"{last.get('estimates', '-')} | {_verdict(row)} |")
    lines += ["", "Best plan per case (last run; predicted from catalog H100 figures):", ""]
    for row in rows:
        last = row["last"]
        if "best" in last:
            mfu = f", MFU {100 * last['best_mfu']:.0f} %" if last.get("best_mfu") else ""
            lines.append(f"- {row['case']}: `{last['best']}` ({last['best_step_s']:.2f} s per step{mfu})")
        else:
            lines.append(f"- {row['case']}: refused: {last['refused']}")
    lines += ["", "Arguments:", ""] + [f"- {name}: `trainwise plan {' '.join(CASES[name][0])}`" for name in
                                      (r["case"] for r in rows)]
    return "\n".join(lines) + "\n"


def _verdict(row: dict) -> str:
    over = [f"{name} {row[key]:.1f} s" for name, key in (("wall", "wall_s"), ("CPU", "cpu_s"))
            if row[key] > row["target_s"]]
    if row["peak_rss_bytes"] > TARGET_BYTES:
        over.append(f"memory {row['peak_rss_bytes'] / 1e9:.2f} GB")
    return "yes" if row["met"] else "no: " + (", ".join(over) or "the run failed")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (default 1: each is long)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--page", type=Path, default=DEFAULT_PAGE)
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown or args.repeat < 1:
        parser.error(f"unknown case(s) {unknown}" if unknown else "--repeat must be 1 or more")
    prov = provenance.collect(provenance.script_command("plan_search_time.py", argv))
    rows = []
    for name in names:
        arguments, target = CASES[name]
        runs = [run_once(arguments) for _ in range(args.repeat)]
        rows.append(summary(name, runs, target))
        print(json.dumps(rows[-1], default=str), flush=True)
    prov = provenance.finish(prov)
    text = provenance.page("Search time of trainwise plan on the CPU", prov,
                           page_body(rows, args.repeat, provenance.busy(prov)))
    atomic_write_text(args.page, text)
    print(f"wrote {args.page}")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
