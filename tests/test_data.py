"""Training data: exact resume from any position, disjoint ranks, real text, clear errors."""

import itertools
import json

import pytest
import torch

from trainwise.engine.data import build_data
from trainwise.engine.data.builtin_corpus import builtin_documents
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan import InputError, Plan

LLAMA = resolve_model("tiny-llama")
PLAN = Plan(device="cpu", batch_size=4, seq_len=64)


def _take(data, start, n):
    return [b["input_ids"] for b in itertools.islice(data.micro_batches(start=start), n)]


@pytest.mark.parametrize("source", ["builtin", "synthetic"])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_index_matches_uninterrupted_stream(source, workers):
    data = build_data(RunConfig(data=source, seed=3), LLAMA, PLAN.replace(workers=workers))
    uninterrupted = _take(data, 0, 12)
    resumed = _take(data, 7, 5)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[7:], resumed))


def test_epochs_reshuffle_deterministically():
    plan = PLAN.replace(seq_len=512, batch_size=64)
    data = build_data(RunConfig(data="builtin", seed=1), LLAMA, plan)
    per_epoch = data._dataset.order.per_epoch
    first, second = _take(data, 0, 1)[0], _take(data, per_epoch, 1)[0]
    assert not torch.equal(first, second)
    again = build_data(RunConfig(data="builtin", seed=1), LLAMA, plan)
    assert torch.equal(_take(again, per_epoch, 1)[0], second)


def test_ranks_get_disjoint_samples():
    run = RunConfig(data="builtin")
    rows = [{tuple(r.tolist()) for b in _take(build_data(run, LLAMA, PLAN, rank=r, world_size=2), 0, 10) for r in b}
            for r in (0, 1)]
    assert rows[0] and not rows[0] & rows[1]


def test_builtin_corpus_is_real_deterministic_text():
    documents = builtin_documents()
    text = " ".join(documents)
    assert len(text) > 300_000 and text.count(" the ") > 1000
    data = build_data(RunConfig(data="builtin"), LLAMA, PLAN)
    assert "builtin corpus" in data.description
    held_out = data.eval_batches(2)
    assert len(held_out) == 2 and held_out[0]["input_ids"].shape == (4, 64)


def _write_corpus(tmp_path, kind):
    lines = [f"line {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(400)]
    if kind == "txt":
        path = tmp_path / "c.txt"
        path.write_text("\n".join(lines))
    elif kind == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_text("\n".join(json.dumps({"body": line}) for line in lines))
    else:
        from datasets import Dataset

        path = tmp_path / "c.parquet"
        Dataset.from_dict({"body": lines}).to_parquet(str(path))
    return path


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_files_are_packed_into_full_sequences(tmp_path, kind):
    path = _write_corpus(tmp_path, kind)
    data = build_data(RunConfig(data=str(path), text_field="body"), LLAMA, PLAN)
    batch = next(data.micro_batches())
    assert batch["input_ids"].shape == (4, 64) and torch.equal(batch["labels"], batch["input_ids"])
    assert b"the" in bytes(t for t in batch["input_ids"][0].tolist() if t < 256)
    assert "byte tokens" in data.description


def test_a_local_tokenizer_directory_is_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = _write_corpus(tmp_path, "txt")
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([str(path)], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(
        tmp_path / "tok")
    data = build_data(RunConfig(data=str(path), tokenizer=str(tmp_path / "tok")), LLAMA, PLAN.replace(seq_len=16))
    ids = next(data.micro_batches())["input_ids"]
    assert ids.max() < 1024 and "tokenizer tok" in data.description


@pytest.mark.parametrize("run, plan, model, field", [
    (RunConfig(data="/no/such.txt"), PLAN, "tiny-llama", "--data"),
    (RunConfig(data="README.md"), PLAN, "tiny-llama", "--data"),
    (RunConfig(data="builtin", tokenizer="/no/tokenizer"), PLAN, "tiny-llama", "--tokenizer"),
    (RunConfig(data="builtin"), PLAN, "tiny-bert", "--data"),
    (RunConfig(data="builtin"), PLAN.replace(seq_len=10**6), "tiny-llama", "--seq-len"),
])
def test_bad_data_settings_name_the_field(run, plan, model, field):
    with pytest.raises(InputError) as caught:
        build_data(run, resolve_model(model), plan)
    assert caught.value.field == field


def test_a_corpus_too_small_for_one_micro_batch_is_an_error(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("just a few words\n")
    with pytest.raises(InputError, match="too few"):
        build_data(RunConfig(data=str(path)), LLAMA, PLAN)
