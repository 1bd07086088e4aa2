"""benchmarks/README.md lists every script of the folder, and nothing that is not there."""

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_the_benchmarks_readme_lists_every_script_once():
    listed = re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", (BENCHMARKS / "README.md").read_text(), flags=re.M)
    present = sorted(p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(listed) == present and len(listed) == len(set(listed))
