"""How long `trainwise plan` takes on this machine's CPU, and how much memory it holds.

Prints one JSON line per case: wall seconds and CPU seconds of the search (in-process,
after the imports), the estimates it ran, the plans it screened, the process's peak
resident memory, whether the plans were ranked by predicted time, and the provenance
(command, commit, versions, CPU count and load average at start and end; a busy machine
makes wall times slower than a quiet one). Targets on 2 cores, without verify: an 8B model
on one GPU <= 30 s, memory <= 4 GB.

    python benchmarks/plan_search_time.py [--device H100] [--model Llama-3.1-8B] [--allow lora]

Exits 1 when a case misses its target.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import warnings

from provenance import add_repo_to_path, collect, finish, script_command

add_repo_to_path()

from trainwise.api.plan import plan_search  # noqa: E402
from trainwise.common.errors import InputError  # noqa: E402
from trainwise.plan.plan import Plan  # noqa: E402

TARGET_S, TARGET_BYTES = 30.0, 4 * 10 ** 9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="H100")
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--allow", default="", help="as `trainwise plan --allow`")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    prov = collect(script_command("plan_search_time.py", sys.argv[1:] if argv is None else argv))
    allow = frozenset(a for a in args.allow.split(",") if a)
    base = Plan(device=args.device, seq_len=args.seq_len)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        report = plan_search(args.model, base, {"device", "seq_len"}, allow=allow, global_batch=args.global_batch)
        outcome = {"plans": len(report.result.screened), "estimates": report.result.evaluations,
                   "timed": report.result.timed, "best": report.result.ranked[0].plan.changed_knobs()}
    except InputError as refused:  # nothing fits is an answer too; its time counts the same
        outcome = {"refused": str(refused)}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    line = {"model": args.model, "device": args.device, "allow": sorted(allow), "search_wall_s": round(wall, 1),
            "search_cpu_s": round(cpu, 1), "peak_rss_bytes": peak, **outcome, "provenance": finish(prov)}
    print(json.dumps(line, default=str))
    return 0 if wall <= TARGET_S and peak <= TARGET_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
