"""`plan --emit`, decided: which targets a model can be written for (checked before the
search), the best plan written for the target (atomically to `--emit-out`), and the
`trainwise train` line of a plan. The writing itself is `trainwise/emit/`."""

from __future__ import annotations

from trainwise.common.atomic import atomic_write_text
from trainwise.emit.targets import emit
from trainwise.emit.train_line import Launch, train_flags


def check_emit_target(target: str | None, model: str) -> None:
    """Refuse, before any search, a model the target cannot train (torchtitan trains only its
    own model flavors)."""
    if target == "torchtitan":
        from trainwise.emit.torchtitan import flavor_of

        flavor_of(model)


def emit_best(report, target: str | None, launch: Launch, out) -> tuple[str, list[str]] | None:
    """(text, knobs the target cannot express) of the search's best plan, written to `out`
    when given; None without a target."""
    if target is None:
        return None
    text, missing = emit(report.result.ranked[0].plan, target, launch)
    if out is not None:
        atomic_write_text(out, text + "\n")
    return text, missing


__all__ = ["Launch", "train_flags", "check_emit_target", "emit_best"]
