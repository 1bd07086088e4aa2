"""What every chart of the command line shares: matplotlib on its file-only backend,
imported only when a chart is asked for; the PNG written atomically and signed, so a file
trainwise did not draw is never replaced."""

from __future__ import annotations

import io
from pathlib import Path

from trainwise.common.atomic import atomic_write_bytes
from trainwise.common.errors import InputError

DPI = 110  # bench's chart resolution, so the pictures read alike
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Written as the PNG's Software text chunk (keyword, NUL, text): the mark of a chart we drew.
SOFTWARE = "trainwise"
_MARK = b"Software\x00" + SOFTWARE.encode()
_HEADER_BYTES = 4096  # text chunks matplotlib writes sit before the image data


def check_chart_path(path: str | Path, flag: str = "--chart") -> Path:
    """Refuse (InputError naming `flag`) a FILE that is not a .png name, or one that exists
    and is not a chart trainwise drew; checked before any work."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise InputError(flag, f"writes a PNG image: give a file name ending in .png (got {str(path)!r})")
    if path.is_symlink() or (path.exists() and not _drawn_by_trainwise(path)):
        raise InputError(flag, f"{path} exists and is not a chart trainwise drew; it is left as it is: "
                               "choose another file name")
    return path


def _drawn_by_trainwise(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(_HEADER_BYTES)
    return head.startswith(PNG_SIGNATURE) and _MARK in head


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure, path: str | Path) -> Path:
    """Write `figure` to `path` as PNG (atomically, signed), close it, and return the path."""
    plt = pyplot()
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": SOFTWARE})
    plt.close(figure)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)
