"""trainwise/hardware/measured_techniques.json from the committed GPU rows files
(docs/results/rows/*.json): which techniques a measured trainwise run used, per GPU class
(compute capability). `plan` marks a technique whose effect it predicts but no committed run
measured on the target's class; docs/ is not installed, so the installed package carries
this record instead (tests/test_measured_techniques.py holds it equal to this script's output).

    python benchmarks/measured_techniques.py   # reads docs/results/rows, writes the record

Read: the trainwise side of each launch of engine_speed.py (its measured plan, where the
launch got as far as timing it). Rows files of other scripts carry no trainwise plan measured
on a GPU (the CPU rows are not a GPU class); a script whose rows do should be added here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = REPO / "docs" / "results" / "rows"
RECORD = REPO / "trainwise" / "hardware" / "measured_techniques.json"


def record(rows_dir: Path = ROWS) -> dict:
    """{"written_by", "rows": files read, "classes": {compute capability: {"gpus", "techniques"}}}."""
    sys.path.insert(0, str(REPO))
    from trainwise.hardware import resolve_device
    from trainwise.plan import Plan
    from trainwise.plan.technique_names import techniques_of

    classes: dict[str, dict[str, set]] = {}
    read = []
    for path in sorted(rows_dir.glob("engine-speed-*.json")):
        gpu = re.match(r"engine-speed-(.+?)(-\d+)?\.json$", path.name).group(1)
        device = resolve_device(gpu)
        if device.gpu is None:
            continue
        read.append(path.name)
        entry = classes.setdefault("{}.{}".format(*device.gpu.compute_capability), {"gpus": set(), "techniques": set()})
        for launch in json.loads(path.read_text())["launches"]:
            side = ((launch.get("result") or {}).get("sides") or {}).get("trainwise")
            if side and side.get("tokens_per_s"):  # measured, not only sized
                entry["gpus"].add(device.gpu.name)
                entry["techniques"].update(techniques_of(Plan.from_dict(side["plan"])))
    return {"written_by": "benchmarks/measured_techniques.py", "rows": read,
            "classes": {cc: {"gpus": sorted(e["gpus"]), "techniques": sorted(e["techniques"])}
                        for cc, e in sorted(classes.items())}}


def render(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def main() -> int:
    sys.path.insert(0, str(REPO))
    from trainwise.common.atomic import atomic_write_text

    atomic_write_text(RECORD, render(record()))
    print(f"wrote {RECORD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
