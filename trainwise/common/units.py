"""Formatting bytes and counts for people."""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2


def human_bytes(nbytes: int | float | None) -> str:
    """Binary units (GiB, MiB, KiB), as nvidia-smi and PyTorch report memory."""
    if nbytes is None:
        return "-"
    magnitude = abs(nbytes)
    if magnitude >= GIB:
        return f"{nbytes / GIB:,.2f} GiB"
    if magnitude >= MIB:
        return f"{nbytes / MIB:,.1f} MiB"
    if magnitude >= 1024:
        return f"{nbytes / 1024:,.1f} KiB"
    return f"{int(nbytes)} B"


def human_count(count: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= size:
            return f"{count / size:,.2f}{unit}"
    return str(count)


def bytes_or_na(nbytes: int | float | None) -> str:
    """human_bytes, with "n/a" where nothing was measured or predicted (a table cell)."""
    return "n/a" if nbytes is None else human_bytes(nbytes)


def signed_percent(value: float | None) -> str:
    """An error in percent with its sign ("+1.2 %"), "0.0 %" below 0.05, "n/a" for None."""
    if value is None:
        return "n/a"
    return "0.0 %" if abs(value) < 0.05 else f"{value:+.1f} %"
