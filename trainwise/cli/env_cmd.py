"""`trainwise env`: the GPUs, how they are linked, versions and optional packages."""

from __future__ import annotations


def register(commands) -> None:
    parser = commands.add_parser("env", help="show this machine: GPUs, links, versions, optional packages")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(run=run)


def run(args) -> int:
    from trainwise.api.environment import environment
    from trainwise.cli.output import print_json
    from trainwise.cli.render_env import render_environment

    env = environment()
    if args.json:
        print_json(env.to_json())
    else:
        render_environment(env)
    return 0
