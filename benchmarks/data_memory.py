"""Peak memory of reading and tokenizing one large .txt file, read whole vs line by line
(trainwise/engine/data/records.py, LINE_RECORDS_ABOVE_BYTES): the figures docs/train.md
quotes under "Large text files".

A deterministic text file of --mb megabytes is written to a temporary folder; then, for
each way of reading it, a fresh process reads and tokenizes it as `trainwise train --data`
does (text_records + tokenized_corpus, byte-level tokens, one process, an empty token
cache) and reports its peak resident memory (getrusage, measured) and anonymous memory
(the peak of /proc/self/status RssAnon sampled every 20 ms, measured; Linux only).
Printed, not written to docs/results: one line per mode with the command, commit and
device above it.

    python benchmarks/data_memory.py            # 40 MB
    python benchmarks/data_memory.py --mb 70
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import provenance

CHILD = r"""
import json, resource, sys, tempfile, threading, time
from pathlib import Path
from trainwise.engine.data import records
from trainwise.engine.data.text_files import text_records
from trainwise.engine.data.token_cache import tokenized_corpus
from trainwise.engine.data.tokens import ByteTokenizer

path, by_line = sys.argv[1], sys.argv[2] == "line"
records.LINE_RECORDS_ABOVE_BYTES = 1 if by_line else 1 << 62
anon = [0]
def sample():
    while True:
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                anon[0] = max(anon[0], int(line.split()[1]) * 1024)
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
found, field = text_records(path, "text")
corpus = tokenized_corpus(found.dataset, field, ByteTokenizer(), 1, cache_dir=Path(tempfile.mkdtemp()),
                          document_ends=found.document_ends())
tokens = len(corpus.stream)
print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_anon": anon[0], "tokens": tokens, "rows": len(found.dataset)}))
"""


def write_text(path: Path, megabytes: float) -> None:
    """Lines of pseudo-random words (seeded), `megabytes` * 1e6 bytes in all."""
    rng = random.Random(0)
    words = ["training", "memory", "token", "model", "batch", "the", "of", "a", "gradient", "é", "step"]
    target, written = int(megabytes * 1e6), 0
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            line = " ".join(rng.choice(words) for _ in range(rng.randint(0, 24))) + "\n"
            out.write(line)
            written += len(line.encode("utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=40.0, help="size of the generated file, MB (default 40)")
    args = parser.parse_args()
    info = provenance.collect(provenance.script_command("data_memory.py", sys.argv[1:]))
    print("\n".join(f"{key}: {value}" for key, value in info.items()))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.txt"
        write_text(path, args.mb)
        size = path.stat().st_size
        for mode in ("whole", "line"):
            done = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(provenance.REPO),
                                       "HF_DATASETS_CACHE": str(Path(folder) / "hf")}, timeout=1800)
            if done.returncode != 0:
                print(f"{mode}: failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{size / 1e6:.1f} MB read {mode:>5}: peak RSS {result['peak_rss'] / 1e9:.2f} GB, "
                  f"peak anonymous {result['peak_anon'] / 1e9:.2f} GB (measured), {result['tokens']:,} tokens, "
                  f"{result['rows']:,} records")


if __name__ == "__main__":
    main()
