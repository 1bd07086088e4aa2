"""`trainwise` command: parse, call the API, render. Exit codes: 0 ok, 2 bad input,
3 out of memory, 4 a checkpoint or result could not be written (disk full, no
permission; what was there before is intact), 128 + N stopped by signal N after saving
(SIGTERM 143, SIGINT 130, SIGUSR1 138: continue with --resume), 1 anything else."""

from __future__ import annotations

import argparse
import os
import sys

from trainwise.engine.preemption import Preempted
from trainwise.common.errors import InputError, OutOfMemory, WriteFailed

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_OOM, EXIT_WRITE = 0, 1, 2, 3, 4


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors become our one-line exit-2 errors."""

    def error(self, message):
        raise InputError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    from trainwise.cli import (bench_cmd, calibrate_cmd, env_cmd, estimate_cmd, export_cmd, models_cmd, plan_cmd,
                               train_cmd)

    parser = _Parser(prog="trainwise", description="Predict, plan, train and measure transformer training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    estimate_cmd.register(commands)
    plan_cmd.register(commands)
    models_cmd.register(commands)
    train_cmd.register(commands)
    bench_cmd.register(commands)
    env_cmd.register(commands)
    export_cmd.register(commands)
    calibrate_cmd.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(argv)  # what `--nproc N` relaunches under torchrun
        if not getattr(args, "run", None):
            build_parser().print_help()
            return EXIT_BAD_INPUT
        return args.run(args) or EXIT_OK
    except InputError as err:
        if debug:
            raise
        print(f"trainwise: error: {_rank_prefix()}{err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OutOfMemory as err:
        print(f"trainwise: error: {err}", file=sys.stderr)
        return EXIT_OOM
    except WriteFailed as err:
        print(f"trainwise: error: {_rank_prefix()}{err}", file=sys.stderr)
        return EXIT_WRITE
    except Preempted as stop:
        if _rank_prefix() == "" or os.environ.get("RANK") == "0":  # rank 0 speaks for the job
            print(f"trainwise: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, exit 1
        if debug:
            raise
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"trainwise: error: {_rank_prefix()}{type(err).__name__}: {first_line} "
              "(rerun with --debug for a traceback)",
              file=sys.stderr)
        return EXIT_ERROR


def _rank_prefix() -> str:
    """"[rank R] " inside a multi-process job, so the failing rank is named."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return f"[rank {os.environ.get('RANK', '?')}] " if world > 1 else ""


if __name__ == "__main__":
    sys.exit(main())
