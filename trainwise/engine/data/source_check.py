"""The --data, --chat and --tokenizer checks that need neither torch nor datasets, so the
command line answers a typo in a path at once, before the heavy imports and before a
`--plan auto` search (build.py runs them again for callers of the API)."""

from __future__ import annotations

from pathlib import Path

from trainwise.common.errors import InputError
from trainwise.engine.data.records import missing_source

NAMED_SOURCES = ("builtin", "synthetic")
_GLOB = "*?["


def check_data_source(run) -> None:
    """InputError naming the flag when `run` (a RunConfig) asks for data that cannot be read."""
    if run.chat and run.data in NAMED_SOURCES:
        raise InputError("--chat", f"formats conversations from a file; --data {run.data} has none: give "
                                   "--data FILE (.jsonl, .parquet, a saved dataset...) with a messages field")
    if run.synthetic_batches and run.data != "synthetic":
        raise InputError("--synthetic-batches", f"repeats synthetic micro-batches; --data {run.data} is not synthetic: "
                                                "drop --synthetic-batches or pass --data synthetic")
    if run.chat and not run.tokenizer:
        raise InputError("--chat", "needs --tokenizer DIR: the model's tokenizer, whose chat template formats the "
                                   "conversations")
    if run.tokenizer and not Path(run.tokenizer).expanduser().is_dir():
        raise InputError("--tokenizer", f"no tokenizer directory at {run.tokenizer}; pass a local directory "
                                        "holding tokenizer.json (or omit --tokenizer for byte tokens)")
    if run.data not in NAMED_SOURCES and not any(c in run.data for c in _GLOB) \
            and not Path(run.data).expanduser().exists():
        raise missing_source(run.data)
