"""`trainwise models`: the catalog with parameter counts."""

from __future__ import annotations


def register(commands) -> None:
    parser = commands.add_parser("models", help="list the model catalog (architectures only, no weights)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args) -> int:
    import dataclasses

    from rich.console import Console
    from rich.table import Table

    from trainwise.cli.output import print_json
    from trainwise.common.units import human_count
    from trainwise.models import catalog_entries

    entries = catalog_entries()
    if args.json:
        print_json([dataclasses.asdict(e) for e in entries])
        return 0
    table = Table(title="Model catalog (configs only; parameter counts computed on the meta device)",
                  title_justify="left")
    for column in ("name", "family", "task", "parameters", "max positions", "hub id"):
        table.add_column(column, justify="right" if column in ("parameters", "max positions") else "left")
    for e in entries:
        table.add_row(e.name, e.family, e.task, f"{e.params:,} ({human_count(e.params)})",
                      str(e.max_positions) if e.max_positions else "unbounded", e.hf_name or "-")
    Console().print(table)
    return 0
