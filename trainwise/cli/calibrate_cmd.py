"""`trainwise calibrate`: measure this machine's device and write its profile."""

from __future__ import annotations

import sys


def register(commands) -> None:
    parser = commands.add_parser(
        "calibrate", help="measure this device (matmul, attention, memory, per-op cost, collectives) "
                          "and write its profile for the step-time prediction")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="profile file to write (default: the per-user cache, keyed by device name, "
                             "where estimate and plan find it)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:K (default: cpu)")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="also time all-reduce, all-gather, reduce-scatter and send/recv between "
                             "N local processes (gloo on the CPU, NCCL on GPUs)")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds instead of about a minute: coarse, for tests")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args) -> int:
    from trainwise.api.calibrate import calibrate, check_calibrate_request
    from trainwise.cli.output import print_json
    from trainwise.cli.render_calibrate import render_calibration

    check_calibrate_request(args.device, args.out, args.nproc)  # bad input: exit 2 before measuring
    if not args.json:
        print(f"measuring {args.device}{f' and {args.nproc} processes' if args.nproc > 1 else ''} "
              f"({'a few seconds' if args.quick else 'about a minute'}) ...", file=sys.stderr, flush=True)
    result = calibrate(args.device, out=args.out, nproc=args.nproc, quick=args.quick)
    for warning in result.warnings:
        print(f"trainwise: warning: {warning}", file=sys.stderr)
    if args.json:
        print_json({"path": str(result.path), "seconds": result.seconds, "warnings": list(result.warnings),
                    "profile": result.profile.to_json()})
    else:
        render_calibration(result)
    return 0
