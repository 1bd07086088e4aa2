"""Download the wheels of trainwise's `gpu` extra for a GPU machine that has no package
registry, to install there with `WHEELS=FOLDER bash benchmarks/gpu_validation.sh ...`.

    python benchmarks/gpu_wheels.py FOLDER [--python 3.12] [NAME==VERSION ...]

Each package of the extra (pyproject.toml) is fetched as a binary wheel for Linux x86-64
and the given Python, without its dependencies (torch, triton and numpy are the GPU
machine's own): the newest release inside the extra's range unless a pin names another
version (torchao's releases each follow one torch release: pin the one that matches the
machine's torch). Prints each file and the folder's size in MiB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# pip matches a manylinux tag exactly, so name every glibc level such wheels are built for.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def gpu_extra() -> list[Requirement]:
    """The `gpu` optional dependencies of pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in project["optional-dependencies"]["gpu"]]


def requested(pins: list[str]) -> list[str]:
    """The extra's requirements as pip arguments, a pin replacing its package's range; a pin of a
    package outside the extra is refused (it would not be what trainwise[gpu] installs)."""
    by_name = {Requirement(pin).name.lower().replace("_", "-"): pin for pin in pins}
    extra = gpu_extra()
    unknown = set(by_name) - {req.name.lower().replace("_", "-") for req in extra}
    if unknown:
        raise ValueError(f"{', '.join(sorted(unknown))} is not in the gpu extra ({', '.join(req.name for req in extra)})")
    return [by_name.get(req.name.lower().replace("_", "-"), str(req)) for req in extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python version (default 3.12)")
    parser.add_argument("pins", nargs="*", help="NAME==VERSION for a package of the extra")
    args = parser.parse_args(argv)
    try:
        requirements = requested(args.pins)
    except ValueError as error:
        parser.error(str(error))  # exit 2
    args.folder.mkdir(parents=True, exist_ok=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    for requirement in requirements:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", args.python, "--implementation", "cp", *platforms,
                        "-d", str(args.folder), requirement], check=True)
    wheels = sorted(args.folder.glob("*.whl"))
    for wheel in wheels:
        print(f"{wheel.name}  {wheel.stat().st_size / 2**20:.1f} MiB")
    print(f"{args.folder}: {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB in {len(wheels)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
