"""A Hub id outside the catalog resolves from its config.json alone: the local Hugging Face
cache first (laid out as the Hub client writes it), never the weights; offline and not
cached, one line names the cache."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import constants

from trainwise.cli.main import main
from trainwise.models import resolve_model
from trainwise.models.catalog import find_record
from trainwise.models.hub_config import looks_like_hub_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache; `add(repo_id, config)` puts a config.json into it."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))

    def add(repo_id: str, config: dict) -> None:
        repo = tmp_path / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo / "snapshots" / COMMIT
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)

    return add


def tiny_llama_config() -> dict:
    return dict(find_record("tiny-llama").hf_config)


def test_a_cached_hub_config_resolves_without_the_network(hub_cache):
    hub_cache("acme/tiny-chat", tiny_llama_config())
    spec = resolve_model("acme/tiny-chat")
    assert spec.source == "hub" and spec.family == "llama" and spec.task == "causal-lm"
    assert spec.hf_name == "acme/tiny-chat" and spec.vocab_size == tiny_llama_config()["vocab_size"]


def test_estimate_reads_a_cached_hub_config(hub_cache, capsys):
    hub_cache("acme/tiny-chat", tiny_llama_config())
    assert main(["estimate", "acme/tiny-chat", "--device", "cpu", "--seq-len", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "acme/tiny-chat" and data["params"] > 0


@pytest.mark.fault
def test_offline_and_not_cached_names_the_cache(hub_cache, tmp_path, capsys, fault_log):
    code = main(["estimate", "acme/not-cached", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "acme/not-cached" in err and str(tmp_path) in err and "HF_HUB_OFFLINE" in err
    fault_log(kind="bad input", case="a Hub id not in the cache, offline", exit_code=code, message=err)


def test_hub_ids_are_told_apart_from_other_names():
    assert looks_like_hub_id("meta-llama/Llama-3.1-8B") and looks_like_hub_id("acme/tiny_chat.v2")
    for name in ("gpt2", "pkg.module:function", "a/b/c", "../x", "/abs/path", "acme/", "-x/y"):
        assert not looks_like_hub_id(name), name
