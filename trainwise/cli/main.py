"""`trainwise` command: parse, call the API, render. Exit codes: 0 ok, 2 bad input,
3 out of memory, 4 a checkpoint or result could not be written (disk full, no
permission; what was there before is intact), 128 + N stopped by signal N after saving
(SIGTERM 143, SIGINT 130, SIGUSR1 138: continue with --resume), 1 anything else."""

from __future__ import annotations

import argparse
import os
import re
import sys

from trainwise.cli.suggest import unknown_flags_message
from trainwise.common.suggest import closest
from trainwise.common.errors import InputError, OutOfMemory, Preempted, WriteFailed

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_OOM, EXIT_WRITE = 0, 1, 2, 3, 4


QUICKSTART = """trainwise: predict, plan, train and measure transformer training.

  trainwise estimate tiny-llama --device H100       memory and step time of one step, predicted
  trainwise plan tiny-llama --device H100 --gpus 8  the fastest plans predicted to fit, ranked
  trainwise train tiny-llama --plan auto            train with the plan chosen for this machine

trainwise COMMAND --help lists a command's flags; trainwise --help lists the commands."""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors become our one-line exit-2 errors, named by the command
    (the "trainwise: error:" prefix is main's, said once)."""

    def error(self, message):
        invalid = re.fullmatch(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)", message)
        if invalid:  # "did you mean" for a command or a flag with choices
            field, typed, allowed = invalid.groups()
            guess = closest(typed, re.findall(r"'([^']*)'", allowed))
            raise InputError(field, f"unknown {typed!r}" + (f"; did you mean {guess}?" if guess else "")
                             + f" (allowed: {allowed.replace(chr(39), '')})")
        raise InputError(self.prog.removeprefix("trainwise").strip() or "usage", message)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._subparsers and getattr(parsed, "command", None)
            sub = _subcommand(self, command) or self
            raise InputError(sub.prog.removeprefix("trainwise").strip() or "usage", unknown_flags_message(extras, sub))
        return parsed


def _subcommand(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser | None:
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if name in getattr(action, "choices", {}):
            return action.choices[name]
    return None


def build_parser() -> argparse.ArgumentParser:
    from trainwise.cli import (bench_cmd, calibrate_cmd, env_cmd, estimate_cmd, export_cmd, models_cmd, plan_cmd,
                               train_cmd)

    parser = _Parser(prog="trainwise", description="Predict, plan, train and measure transformer training.")
    parser.add_argument("--version", action="version", version=f"trainwise {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    estimate_cmd.register(commands)
    plan_cmd.register(commands)
    models_cmd.register(commands)
    train_cmd.register(commands)
    bench_cmd.register(commands)
    env_cmd.register(commands)
    export_cmd.register(commands)
    calibrate_cmd.register(commands)
    for command in (parser, *commands.choices.values()):  # one definition, on every command
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return parser


def _version() -> str:
    """The installed package's version (its metadata, as pip records it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainwise")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        # A torchrun worker, in a session of its own: when its agent dies unable to pass a
        # signal on (SIGKILL), it stops after its step and saves, instead of training on as
        # an orphan. First thing, so no import's seconds leave a window.
        from trainwise.common.parent_death import stop_with_parent

        stop_with_parent()
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(argv)  # what `--nproc N` relaunches under torchrun
        if not getattr(args, "run", None):
            print(QUICKSTART)
            return EXIT_OK if not argv else EXIT_BAD_INPUT
        from trainwise.cli.flags import check_device_name

        check_device_name(getattr(args, "device", None))  # every command's: before the heavy imports
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
