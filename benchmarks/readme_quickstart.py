"""README.md's Quickstart blocks: each command run now, its output written between the
README's markers, and the memory anatomy picture of the estimate saved as
docs/memory-anatomy.png.

    python benchmarks/readme_quickstart.py            # rewrite the blocks and the picture
    python benchmarks/readme_quickstart.py --check    # exit 1 if a block differs from a run now

Each command runs as a fresh machine would run it: in an empty directory, with an empty
trainwise cache (no device profile calibrated, no token cache) and the Hub offline.
Output is what a terminal 100 columns wide shows (stdout and stderr as they interleave),
less PyTorch's C++ warning lines (`[W...]`, the profiler's notices), which say nothing
about trainwise. tests/test_readme_quickstart.py compares the blocks with a run now, the
parts that differ from run to run (times, speeds, losses measured on a CPU, temporary
paths) masked by `mask`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from trainwise.common.atomic import atomic_write_bytes, atomic_write_text  # noqa: E402

README = provenance.REPO / "README.md"
PICTURE = provenance.REPO / "docs" / "memory-anatomy.png"
CHART_NAME = "anatomy.png"
# (block name, the command after `trainwise`), in the README's order.
COMMANDS = (
    ("estimate", ["estimate", "Llama-3.2-1B", "--device", "H100", "--seq-len", "2048", "--batch-size", "8",
                  "--precision", "bf16", "--chart", CHART_NAME]),
    ("plan", ["plan", "Llama-3.2-1B", "--device", "H100", "--seq-len", "2048", "--global-batch", "64"]),
    ("train", ["train", "tiny-llama", "--plan", "auto", "--device", "cpu", "--seq-len", "64", "--global-batch", "8",
               "--steps", "20", "--out", "run"]),
)
COLUMNS = "100"
# What changes from run to run, each replaced by a placeholder: times and speeds, the loss
# measured on a CPU (its bf16 kernels differ by instruction set), and temporary paths.
MASKS = (
    (re.compile(r"\d[\d,]*(\.\d+)? (s\b|tok/s|samples/s)"), r"<n> \2"),
    (re.compile(r"(loss|final loss\s*│)\s+\d+\.\d+"), r"\1 <loss>"),
    (re.compile(r"(│ (time \(s\)|samples/s|tokens/s)( \(job\)| per GPU)?\s*│)\s*[\d,.]+"), r"\1 <n>"),
)


def marker(name: str) -> tuple[str, str]:
    return f"<!-- quickstart:{name} (written by benchmarks/readme_quickstart.py) -->", f"<!-- /quickstart:{name} -->"


PROGRESS_LINE = re.compile(r"^[a-z][\w ,()]*: \d+/\d+$")


def run(argv: list[str], workdir: Path, cache: Path) -> str:
    """What `trainwise ARGV` prints in `workdir` (stdout and stderr interleaved), as shown in the README."""
    env = {**os.environ, "COLUMNS": COLUMNS, "TRAINWISE_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("TERM", None)
    done = subprocess.run([sys.executable, "-m", "trainwise", *argv], cwd=workdir, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"trainwise {' '.join(argv)} exited {done.returncode}:\n{done.stdout}")
    # A search's progress lines (printed off a terminal) are a bar a terminal clears.
    lines = [line.rstrip() for line in done.stdout.splitlines()
             if not line.startswith("[W") and not PROGRESS_LINE.match(line)]
    text = "\n".join(lines).strip("\n").replace(str(workdir), ".")
    return f"$ trainwise {' '.join(argv)}\n{text}"


def run_all() -> tuple[dict[str, str], bytes]:
    """Every block's text, and the estimate's chart (PNG bytes)."""
    with tempfile.TemporaryDirectory(prefix="trainwise-quickstart-") as scratch:
        workdir, cache = Path(scratch) / "work", Path(scratch) / "cache"
        workdir.mkdir()
        blocks = {name: run(argv, workdir, cache) for name, argv in COMMANDS}
        return blocks, (workdir / CHART_NAME).read_bytes()


def mask(text: str) -> str:
    for pattern, placeholder in MASKS:
        text = pattern.sub(placeholder, text)
    return text


def readme_blocks(readme: str) -> dict[str, str]:
    """The text inside each quickstart block of the README (without its fences)."""
    blocks = {}
    for name, _ in COMMANDS:
        start, end = marker(name)
        if start not in readme or end not in readme:
            raise ValueError(f"README.md has no {start} ... {end} block")
        inside = readme.split(start, 1)[1].split(end, 1)[0].strip()
        blocks[name] = inside.removeprefix("```text").removesuffix("```").strip("\n")
    return blocks


def with_blocks(readme: str, blocks: dict[str, str]) -> str:
    for name, text in blocks.items():
        start, end = marker(name)
        before, rest = readme.split(start, 1)
        after = rest.split(end, 1)[1]
        readme = f"{before}{start}\n```text\n{text}\n```\n{end}{after}"
    return readme


def differences(readme: str, blocks: dict[str, str]) -> list[str]:
    """The names of the README blocks that differ from `blocks`, once masked."""
    shown = readme_blocks(readme)
    return [name for name, text in blocks.items() if mask(shown[name]) != mask(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if a block differs")
    args = parser.parse_args(argv)
    blocks, picture = run_all()
    readme = README.read_text()
    if args.check:
        stale = differences(readme, blocks)
        print("README quickstart blocks differ from a run now: " + ", ".join(stale) if stale
              else "README quickstart blocks match a run now")
        return 1 if stale else 0
    atomic_write_text(README, with_blocks(readme, blocks))
    atomic_write_bytes(PICTURE, picture)
    print(f"wrote {README} and {PICTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
