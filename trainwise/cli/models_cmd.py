"""`trainwise models`: the catalog with parameter counts."""

from __future__ import annotations

WIDE = 110  # columns the table needs for the Hub id column


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
    console = Console()
    # The name (what MODEL takes) and the numbers are never cut; below WIDE columns the Hub
    # id is left out (said under the table) rather than cut to a useless prefix.
    wide = console.width >= WIDE
    table = Table(title="Model catalog (configs only; parameter counts computed on the meta device)",
                  title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("family", overflow="fold", min_width=6)
    table.add_column("task", overflow="fold", min_width=9)
    table.add_column("parameters", justify="right", no_wrap=True)
    table.add_column("positions", justify="right", no_wrap=True)
    if wide:
        table.add_column("hub id", overflow="fold")
    for e in entries:
        row = [e.name, e.family, e.task, human_count(e.params), str(e.max_positions) if e.max_positions else "unbounded"]
        table.add_row(*row, *([e.hf_name or "-"] if wide else []))
    console.print(table)
    if not wide:
        console.print(f"Hub ids: a terminal of {WIDE}+ columns, or `trainwise models --json` (with exact "
                      "parameter counts)")
    return 0
