"""The trace cache (trainwise/estimator/trace_cache.py): a repeated estimate of a catalog
model reads what its traces gave instead of building and tracing the model again."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from trainwise.api.estimate import estimate
from trainwise.estimator import trace_cache
from trainwise.plan.plan import Plan

MODEL = "tiny-llama"
PLAN = Plan(device="A100-40GB", batch_size=2, seq_len=32)


def _json(result) -> str:
    return json.dumps(result.to_json(), sort_keys=True)


@pytest.fixture
def traces_counted(monkeypatch):
    """How many times an estimate traced the model."""
    module = sys.modules["trainwise.api.estimate"]

    calls = []
    real = module._one_device

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "_one_device", counted)
    return calls


def test_a_repeated_estimate_reads_the_cache_and_gives_the_same_json(traces_counted):
    first = estimate(MODEL, PLAN, cache=True)
    again = estimate(MODEL, PLAN, cache=True)
    assert len(traces_counted) == 1 and not first.from_cache and again.from_cache
    assert _json(again) == _json(first)
    assert len(list(trace_cache.trace_cache_dir().glob("*.json"))) == 1


def test_without_cache_nothing_is_read_or_kept(traces_counted):
    estimate(MODEL, PLAN)
    estimate(MODEL, PLAN)
    assert len(traces_counted) == 2 and not trace_cache.trace_cache_dir().exists()


@pytest.mark.parametrize("change", [
    {"plan": {"batch_size": 3}}, {"plan": {"seq_len": 48}}, {"plan": {"precision": "bf16"}},
    {"plan": {"grad_ckpt": True}}, {"plan": {"attention": "eager"}}, {"plan": {"lora_rank": 4}},
    {"plan": {"compile": True}}, {"plan": {"device": "H100-80GB"}}, {"task": "seq-cls"},
])
def test_a_changed_plan_field_device_or_task_misses(traces_counted, change):
    estimate(MODEL, PLAN, cache=True)
    changed = estimate(MODEL, PLAN.replace(**change.get("plan", {})), task=change.get("task"), cache=True)
    assert len(traces_counted) == 2 and not changed.from_cache


def test_the_key_changes_with_the_config_the_versions_and_the_source(monkeypatch):
    from trainwise.hardware import resolve_device
    from trainwise.models.catalog import find_record

    record, device = find_record(MODEL), resolve_device(PLAN.device)
    base = trace_cache.cache_key(record, None, PLAN, device)
    assert trace_cache.cache_key(record, None, PLAN, device) == base
    wider = dataclasses.replace(record, hf_config={**record.hf_config, "intermediate_size": 999})
    assert trace_cache.cache_key(wider, None, PLAN, device) != base
    versions = trace_cache.versions()
    monkeypatch.setattr(trace_cache, "versions", lambda: {**versions, "torch": "0.0-other"})
    assert trace_cache.cache_key(record, None, PLAN, device) != base
    monkeypatch.setattr(trace_cache, "versions", lambda: versions)
    assert trace_cache.cache_key(record, None, PLAN, device) == base
    monkeypatch.setattr(trace_cache, "source_hash", lambda: "0" * 64)
    assert trace_cache.cache_key(record, None, PLAN, device) != base


def test_the_source_hash_reads_every_trainwise_file(tmp_path, monkeypatch):
    """An edited file under trainwise/ changes the hash (a copy of the package, edited)."""
    import shutil

    import trainwise

    copy = tmp_path / "trainwise"
    shutil.copytree(os.path.dirname(trainwise.__file__), copy, ignore=shutil.ignore_patterns("__pycache__"))
    hashed = []
    for edit in (None, "trace/depth.py", "estimator/memory.py", "models/catalog/gpt2.json"):
        if edit:
            (copy / edit).write_text((copy / edit).read_text() + "\n")
        monkeypatch.setattr(trace_cache, "__file__", str(copy / "estimator" / "trace_cache.py"))
        trace_cache.source_hash.cache_clear()
        hashed.append(trace_cache.source_hash())
    trace_cache.source_hash.cache_clear()
    assert len(set(hashed)) == 4


@pytest.mark.parametrize("damage", [b"{not json", b'{"format": 1}', b"\xff\xfe", b'{"format": 99}'])
def test_a_damaged_cache_file_is_traced_afresh_with_a_note(traces_counted, damage):
    first = estimate(MODEL, PLAN, cache=True)
    (path,) = trace_cache.trace_cache_dir().glob("*.json")
    path.write_bytes(damage)
    again = estimate(MODEL, PLAN, cache=True)
    assert len(traces_counted) == 2 and not again.from_cache
    assert any("damaged" in note and str(path) in note for note in again.notes)
    assert again.memory == first.memory and again.time == first.time
    assert estimate(MODEL, PLAN, cache=True).from_cache  # rewritten whole


ARGV = ["estimate", MODEL, "--device", "A100-40GB", "--batch-size", "2", "--seq-len", "32"]


def test_the_command_line_says_when_it_read_the_cache_and_no_cache_traces(traces_counted, capsys):
    from trainwise.cli.main import main

    assert main(ARGV) == 0 and "reused from the cache" not in capsys.readouterr().out
    assert main(ARGV) == 0 and "traces: reused from the cache" in capsys.readouterr().out
    assert main([*ARGV, "--json"]) == 0
    out, err = capsys.readouterr()
    assert "reused from the cache" in err and "reused" not in out
    assert main([*ARGV, "--no-cache"]) == 0 and "reused" not in capsys.readouterr().out
    assert len(traces_counted) == 2


# What `estimate --json` never needs: torch and transformers (most of a cold start's time)
# where the cache answers, and on every run the table's rich, the plan file's yaml, train's
# run checks (registering train's flags imports its module) and the --from-training-args
# readers.
NOT_IMPORTED = ("torch", "transformers", "rich", "yaml", "trainwise.engine.data", "trainwise.engine.reports",
                "trainwise.plan.foreign_config")


def test_a_cached_json_estimate_imports_nothing_it_does_not_need(tmp_path, monkeypatch):
    """The command line's run of a request another process traced: none of NOT_IMPORTED
    imported, no model built, the traced estimate's JSON."""
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    traced = estimate(MODEL, PLAN, cache=True)
    code = ("import sys, runpy; sys.argv = sys.argv[1:]\n"
            "try:\n    runpy.run_module('trainwise', run_name='__main__')\n"
            "except SystemExit as stop:\n    assert not stop.code, stop.code\n"
            f"print('imported:', [name for name in {NOT_IMPORTED!r} if name in sys.modules], file=sys.stderr)")
    again = subprocess.run([sys.executable, "-c", code, "trainwise", *ARGV, "--json"], capture_output=True, text=True,
                           env=dict(os.environ), timeout=300)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(json.dumps(traced.to_json()))
    assert "reused from the cache" in again.stderr
    assert again.stderr.strip().splitlines()[-1] == "imported: []"
