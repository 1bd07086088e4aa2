"""Where a results page came from: the command, the commit, the device, the versions and
how busy the machine was. Every script that writes under docs/results/ starts its page
with `header()`, so a page always says how to reproduce it and what it was measured on.

    prov = provenance.collect("python benchmarks/scaling.py --page docs/results/scaling-cpu.md")
    ...measure...
    text = provenance.page("Parallel layouts on CPU", provenance.finish(prov), body)

A page's provenance is a `## Provenance` list of `- key: value` lines; `parse()` reads
it back (tests/test_results_provenance.py holds every page in docs/results/ to it).
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Each docs/results page must name these, the versions with at least VERSION_NAMES.
REQUIRED_KEYS = ("command", "commit", "device", "versions")
VERSION_NAMES = ("python", "torch", "transformers", "trainwise")
# A 1-minute load average above this share of the cores means other work shared the CPU:
# the rule for rows written before the machine's busy time was recorded (a load average
# counts the measurement's own work too, so a 2-core benchmark read busy by its end).
BUSY_LOAD_PER_CORE = 0.5


def script_command(script: str, argv: list[str]) -> str:
    """The command line that reproduces a page: `python benchmarks/<script> <argv>`."""
    return " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, argv)])


def collect(command: str) -> dict:
    """Provenance at the start of a measurement (the load average and the machine's and this
    process tree's CPU seconds are taken now)."""
    return {"command": command, "commit": git_commit(), "device": device_description(),
            "versions": versions(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_start": load_average(), "cores": cpu_count(), "cpu_probe": cpu_probe()}


def finish(prov: dict) -> dict:
    """`prov` with the load average at the end of the measurement and the CPUs other
    processes used on average since `collect` (call it when the measurement's own child
    processes have ended: their CPU time is then this tree's). Can be called again."""
    others = others_cpus_since(prov.get("cpu_probe"))
    return {**prov, "load_end": load_average(), **({"others_cpus": others} if others is not None else {})}


def cpu_probe() -> dict | None:
    """The machine's and this process tree's busy CPU seconds now (trainwise.common.noise)."""
    from trainwise.common.noise import cpu_probe as probe

    return probe()


def others_cpus_since(probe: dict | None) -> float | None:
    """CPUs' worth of work other processes did on average since `probe`: the measurement's
    interference, which its own work (counted in a load average) is not."""
    from trainwise.common.noise import others_cpus_since as others

    value = others(probe)
    return None if value is None else round(value, 2)


def busy(prov: dict) -> bool:
    """Whether other work shared the CPU during the measurement: other processes used more
    than half a CPU on average (noise.IDLE_SLACK_CPUS); for older rows without that
    figure, the load average rule."""
    from trainwise.common.noise import IDLE_SLACK_CPUS

    if prov.get("others_cpus") is not None:
        return prov["others_cpus"] > IDLE_SLACK_CPUS
    loads = [v for v in (prov.get("load_start"), prov.get("load_end")) if v is not None]
    return bool(loads) and max(loads) > BUSY_LOAD_PER_CORE * (prov.get("cores") or 1)


def git_commit() -> str:
    """'<full hash> (clean tree)' or '(dirty tree: ...)'; outside a checkout, $RESULTS_COMMIT
    or 'unknown'."""
    try:
        head = _git("rev-parse", "HEAD")
        changed = [line[3:] for line in _git("status", "--porcelain", strip=False).splitlines() if line.strip()]
    except (OSError, subprocess.CalledProcessError):
        # A copy without .git (e.g. sent to a GPU machine): the sender may name the commit.
        named = os.environ.get("RESULTS_COMMIT")
        return f"{named} (named by RESULTS_COMMIT; no git checkout here)" if named else "unknown (not a git checkout)"
    if not changed:
        return f"{head} (clean tree)"
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return f"{head} (dirty tree: {shown})"


def _git(*args: str, strip: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return out.strip() if strip else out


def device_description() -> str:
    """The CPU model and cores, and the GPU's name when torch sees one."""
    cpu = f"CPU {cpu_model()}, {cpu_count()} cores"
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return f"GPU {props.name} ({props.total_memory / 1024**3:.2f} GiB) x {torch.cuda.device_count()}; {cpu}"
    except ImportError:
        pass
    return cpu


def cpu_model() -> str:
    from trainwise.hardware.host import cpu_model as host_cpu_model

    return host_cpu_model()


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# Packages that change what a page reports where they are installed (float8 plans trace
# through torchao, LoRA through peft, the Liger kernels through liger-kernel, 8-bit
# optimizers through bitsandbytes): named with their version or "not installed".
OPTIONAL_PACKAGES = ("peft", "torchao", "liger-kernel", "bitsandbytes")


def versions() -> str:
    import torch
    import transformers

    import trainwise

    return (f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"trainwise {trainwise.__version__}, {optional_versions()}; {platform.platform()}")


def optional_versions() -> str:
    """"peft 0.x, torchao not installed, ..." as this process would import them (its sys.path):
    the versions the trace cache keys a trace by, which hold every package here."""
    from trainwise.estimator.trace_cache import versions as traced_versions

    found = traced_versions()
    return ", ".join(f"{name} {found[name]}" if found[name] else f"{name} not installed" for name in OPTIONAL_PACKAGES)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def load_line(prov: dict) -> str:
    """How busy the machine was: the CPUs other processes used during the measurement where
    recorded, the 1-minute load average at start and end (which counts the measurement's own
    work too), and the verdict."""
    start, end, cores = prov.get("load_start"), prov.get("load_end"), prov.get("cores") or 1
    if start is None and prov.get("others_cpus") is None:
        return "not available on this system"
    verdict = ("busy: other work shared the CPU, so times are noisier and slower than on a quiet machine"
               if busy(prov) else "quiet")
    loads = f"1-minute load average {start} at start, {end} at end, on {cores} cores"
    if prov.get("others_cpus") is not None:
        return (f"other processes used {prov['others_cpus']} CPUs on average during the measurement "
                f"({loads}, this measurement's own work included): {verdict}")
    return f"{loads}: {verdict}"


def header(prov: dict) -> str:
    """The page's `## Provenance` section."""
    lines = ["## Provenance", "",
             f"- command: `{prov['command']}`",
             f"- commit: {prov['commit']}",
             f"- device: {prov['device']}",
             f"- versions: {prov['versions']}",
             f"- date: {prov['date']}"]
    if "load_start" in prov:
        lines.append(f"- machine load: {load_line(prov)}")
    lines += [f"- {key}: {value}" for key, value in prov.get("extra", {}).items()]
    return "\n".join(lines) + "\n"


def page(title: str, prov: dict, body: str) -> str:
    """A whole results page: title, the written-by line, provenance, then `body`."""
    script = prov["command"].split()[1] if len(prov["command"].split()) > 1 else prov["command"]
    return (f"# {title}\n\n*Written by `{script}`; do not edit by hand: run the command below again.*\n\n"
            f"{header(prov)}\n{body.rstrip()}\n")


def of_launches(launches: list[dict], command: str, describe) -> dict:
    """The provenance of a page rendered from several launches' rows files (each a dict with
    its "provenance"): every launch's commit and date, the first's device and versions, and
    one line per launch from `describe(launch)`."""
    first = launches[0]["provenance"]
    return {"command": command,
            "commit": "; ".join(f"launch {n}: {l['provenance']['commit']}" for n, l in enumerate(launches, 1)),
            "device": first["device"], "versions": first["versions"],
            "date": ", ".join(l["provenance"]["date"] for l in launches),
            "extra": {f"launch {n}": describe(l) for n, l in enumerate(launches, 1)}}


def parse(text: str) -> dict:
    """The `- key: value` lines of a page's `## Provenance` section (empty when none)."""
    match = re.search(r"^## Provenance\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    if not match:
        return {}
    found = {}
    for line in match.group(1).splitlines():
        item = re.match(r"- ([\w ]+): (.*)", line)
        if item:
            found[item.group(1)] = item.group(2).strip()
    return found


def add_repo_to_path() -> None:
    """Let a script run as `python benchmarks/x.py` from a checkout (no install)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def read_launches(paths: list[Path], script: str, producer: str) -> list[dict] | None:
    """The launches of rows files that `producer` (a benchmarks/ script) wrote, in the order
    given; None after printing one line naming the file when one cannot be read as such."""
    import json

    launches = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            print(f"{script}: error: {path}: cannot be read as JSON ({error})", file=sys.stderr)
            return None
        if not isinstance(data, dict) or not isinstance(data.get("launches"), list) or not data["launches"]:
            print(f"{script}: error: {path}: not a rows file of benchmarks/{producer} (needs launches)",
                  file=sys.stderr)
            return None
        launches += data["launches"]
    return launches


def write_page(out: Path, text: str) -> None:
    """Write a rendered page atomically and say where."""
    add_repo_to_path()
    from trainwise.common.atomic import atomic_write_text

    atomic_write_text(out, text)
    print(f"wrote {out}")

