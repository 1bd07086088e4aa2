"""Training data: exact resume from any position, per-epoch shuffling, disjoint ranks,
real text, local files and tokenizers, padding only where unavoidable, clear errors."""

import dataclasses
import itertools
import json

import pytest
import torch

from trainwise.engine.data import TrainData, build_data
from trainwise.engine.data.builtin_corpus import builtin_documents
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan import InputError, Plan

LLAMA = resolve_model("tiny-llama")
BERT = resolve_model("tiny-bert")
PLAN = Plan(device="cpu", batch_size=4, seq_len=64)
LINES = [f"line {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(400)]


def _take(data: TrainData, start: int, n: int, key: str = "input_ids") -> list[torch.Tensor]:
    return [batch[key] for batch in itertools.islice(data.micro_batches(start=start), n)]


def _rows(batches: list[torch.Tensor]) -> list[tuple[int, ...]]:
    return [tuple(row.tolist()) for batch in batches for row in batch]


def _write_corpus(tmp_path, kind: str, lines=LINES):
    path = tmp_path / f"corpus.{kind}"
    if kind == "txt":
        path.write_text("\n".join(lines))
    elif kind == "jsonl":
        path.write_text("\n".join(json.dumps({"body": line, "id": i}) for i, line in enumerate(lines)))
    else:
        from datasets import Dataset

        Dataset.from_dict({"body": lines}).to_parquet(str(path))
    return path


def _save_word_tokenizer(directory, text_file, extra_words: int = 0, json_only: bool = False):
    """A word-level tokenizer trained on `text_file`, saved locally (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([str(text_file)], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    tokenizer.add_tokens([f"extra{i}" for i in range(extra_words)])
    directory.mkdir()
    if json_only:
        tokenizer.save(str(directory / "tokenizer.json"))
    else:
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(
            directory)
    return directory


# ---------------------------------------------------------------- order and resume

@pytest.mark.parametrize("source", ["builtin", "synthetic"])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_index_matches_uninterrupted_stream(source, workers):
    data = build_data(RunConfig(data=source, seed=3), LLAMA, PLAN.replace(workers=workers))
    uninterrupted = _take(data, 0, 12)
    resumed = _take(data, 7, 5)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[7:], resumed, strict=True))


def test_resume_across_an_epoch_boundary_matches_uninterrupted_stream(tmp_path):
    data = build_data(RunConfig(data=str(_write_corpus(tmp_path, "txt"))), LLAMA, PLAN)
    per_epoch = data.micro_batches_per_epoch
    uninterrupted = _take(data, 0, per_epoch + 3)
    resumed = _take(data, per_epoch - 2, 5)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[per_epoch - 2:], resumed, strict=True))


def test_workers_do_not_change_the_batches():
    run = RunConfig(data="builtin", seed=5)
    in_process = _take(build_data(run, LLAMA, PLAN), 3, 4)
    with_workers = _take(build_data(run, LLAMA, PLAN.replace(workers=2)), 3, 4)
    assert all(torch.equal(a, b) for a, b in zip(in_process, with_workers, strict=True))


def test_an_epoch_visits_distinct_rows_and_epochs_reshuffle_deterministically(tmp_path):
    path = str(_write_corpus(tmp_path, "txt"))
    data = build_data(RunConfig(data=path, seed=1), LLAMA, PLAN)
    per_epoch = data.micro_batches_per_epoch
    first_epoch, second_epoch = _take(data, 0, per_epoch), _take(data, per_epoch, per_epoch)
    assert len(set(_rows(first_epoch))) == per_epoch * PLAN.batch_size
    assert len(set(_rows(second_epoch))) == per_epoch * PLAN.batch_size
    assert _rows(first_epoch) != _rows(second_epoch)  # a new order, not a replay
    again = build_data(RunConfig(data=path, seed=1), LLAMA, PLAN)
    assert _rows(_take(again, per_epoch, per_epoch)) == _rows(second_epoch)
    other_seed = build_data(RunConfig(data=path, seed=2), LLAMA, PLAN)
    assert _rows(_take(other_seed, 0, per_epoch)) != _rows(first_epoch)


def test_ranks_get_disjoint_shares_of_each_epoch(tmp_path):
    run = RunConfig(data=str(_write_corpus(tmp_path, "txt")))
    ranks = [build_data(run, LLAMA, PLAN, rank=r, world_size=2) for r in (0, 1)]
    per_epoch = ranks[0].micro_batches_per_epoch
    assert per_epoch == build_data(run, LLAMA, PLAN).micro_batches_per_epoch // 2
    shares = [set(_rows(_take(data, 0, per_epoch))) for data in ranks]
    assert len(shares[0]) == len(shares[1]) == per_epoch * PLAN.batch_size
    assert not shares[0] & shares[1]


def test_synthetic_batches_are_reproducible_per_index_for_any_task():
    for spec in (LLAMA, BERT):
        data = build_data(RunConfig(data="synthetic", seed=7), spec, PLAN)
        rebuilt = build_data(RunConfig(data="synthetic", seed=7), spec, PLAN)
        fifth = next(data.micro_batches(start=5))
        assert all(torch.equal(fifth[k], v) for k, v in next(rebuilt.micro_batches(start=5)).items())
        assert not torch.equal(fifth["input_ids"], next(data.micro_batches(start=6))["input_ids"])
        assert set(fifth) >= {"input_ids", "labels"} and fifth["input_ids"].max() < spec.vocab_size
    ranks = [_take(build_data(RunConfig(data="synthetic"), LLAMA, PLAN, rank=r, world_size=2), 0, 1)[0]
             for r in (0, 1)]
    assert not torch.equal(*ranks)


def test_synthetic_eval_batches_are_fixed_and_differ_from_training():
    data = build_data(RunConfig(data="synthetic"), LLAMA, PLAN)
    held_out = data.eval_batches(3)
    assert len(held_out) == 3 and all(torch.equal(a["input_ids"], b["input_ids"])
                                      for a, b in zip(held_out, data.eval_batches(3), strict=True))
    assert not any(torch.equal(h["input_ids"], t) for h in held_out for t in _take(data, 0, 10))


# ---------------------------------------------------------------- the builtin corpus

def test_builtin_corpus_is_real_deterministic_text():
    documents = builtin_documents()
    text = "\n".join(documents)
    assert 300_000 < len(text.encode()) < 2_000_000
    assert sum(c.isascii() for c in text) / len(text) > 0.99
    words = text.split()
    assert sum(w.isalpha() for w in words) / len(words) > 0.6 and text.count(" the ") > 1000
    builtin_documents.cache_clear()
    assert builtin_documents() == documents


def test_builtin_batches_are_causal_lm_batches_of_bytes():
    data = build_data(RunConfig(data="builtin"), LLAMA, PLAN)
    assert data.description.startswith("builtin corpus") and "byte tokens" in data.description
    assert data.tokens_per_micro_batch == PLAN.batch_size * PLAN.seq_len
    batch = next(data.micro_batches())
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (4, 64) and torch.equal(batch["labels"], batch["input_ids"])
    assert bool(batch["attention_mask"].all()) and batch["input_ids"].max() <= 256
    held_out = data.eval_batches(2)
    assert len(held_out) == 2 and held_out[0]["input_ids"].shape == (4, 64)


# ---------------------------------------------------------------- local files

@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_files_are_packed_into_full_sequences(tmp_path, kind):
    path = _write_corpus(tmp_path, kind)
    data = build_data(RunConfig(data=str(path), text_field="body"), LLAMA, PLAN)
    batch = next(data.micro_batches())
    assert batch["input_ids"].shape == (4, 64) and torch.equal(batch["labels"], batch["input_ids"])
    assert b"quick brown fox" in b"".join(bytes(t for t in row.tolist() if t < 256) for row in batch["input_ids"])
    assert "byte tokens" in data.description and str(path) in data.description


def test_a_directory_of_files_is_read_in_path_order(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.txt").write_text("\n".join(LINES[200:]))
    (tmp_path / "data" / "a.txt").write_text("\n".join(LINES[:200]))
    whole = build_data(RunConfig(data=str(_write_corpus(tmp_path, "txt"))), LLAMA, PLAN)
    split = build_data(RunConfig(data=str(tmp_path / "data")), LLAMA, PLAN)
    assert split.micro_batches_per_epoch == whole.micro_batches_per_epoch


def test_held_out_sequences_are_never_trained_on(tmp_path):
    data = build_data(RunConfig(data=str(_write_corpus(tmp_path, "txt"))), LLAMA, PLAN)
    trained = set(_rows(_take(data, 0, 3 * data.micro_batches_per_epoch)))
    held_out = set(_rows([b["input_ids"] for b in data.eval_batches(100)]))
    assert held_out and not trained & held_out


def test_the_eval_tail_is_padded_to_a_multiple_of_8_and_masked(tmp_path):
    text = "".join(LINES)[: 10 * 64 + 13 - 1]  # plus one end-of-document byte: 10 rows and a 13-token tail
    path = tmp_path / "c.txt"
    path.write_text(text)
    data = build_data(RunConfig(data=str(path), eval_batches=1), LLAMA, PLAN.replace(batch_size=2))
    tail = data.eval_batches(100)[-1]
    assert tail["input_ids"].shape[1] == 64  # sits in a batch with a full row
    last = tail["labels"][-1]
    assert (last[:13] >= 0).all() and (last[13:] == -100).all()
    assert tail["attention_mask"][-1].sum() == 13


def test_a_corpus_shorter_than_one_sequence_is_padded_and_masked(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("just a few words")  # 16 bytes and an end-of-document id: 17 tokens
    data = build_data(RunConfig(data=str(path)), LLAMA, PLAN.replace(batch_size=1))
    batch = next(data.micro_batches())
    assert batch["input_ids"].shape == (1, 24)
    assert batch["attention_mask"].tolist() == [[1] * 17 + [0] * 7]
    assert batch["labels"][0, 17:].eq(-100).all() and data.tokens_per_micro_batch == 17


def test_a_local_tokenizer_directory_is_used(tmp_path):
    path = _write_corpus(tmp_path, "txt")
    tokenizer_dir = _save_word_tokenizer(tmp_path / "tok", path)
    data = build_data(RunConfig(data=str(path), tokenizer=str(tokenizer_dir)), LLAMA, PLAN.replace(seq_len=16))
    ids = next(data.micro_batches())["input_ids"]
    assert ids.shape == (4, 16) and ids.max() < 1024 and "tokenizer tok" in data.description
    assert ids.unique().numel() > 8  # words, not bytes


def test_a_tokenizer_json_only_directory_is_enough(tmp_path):
    path = _write_corpus(tmp_path, "txt")
    tokenizer_dir = _save_word_tokenizer(tmp_path / "tok", path, json_only=True)
    data = build_data(RunConfig(data=str(path), tokenizer=str(tokenizer_dir)), LLAMA, PLAN.replace(seq_len=16))
    assert next(data.micro_batches())["input_ids"].shape == (4, 16)


# ---------------------------------------------------------------- errors

def _field_of_error(run, spec=LLAMA, plan=PLAN) -> str:
    with pytest.raises(InputError) as caught:
        build_data(run, spec, plan)
    return caught.value.field


def test_missing_or_unsupported_data_is_a_data_error(tmp_path):
    (tmp_path / "notes.md").write_text("# not a data file")
    (tmp_path / "empty").mkdir()
    assert _field_of_error(RunConfig(data=str(tmp_path / "no_such.txt"))) == "--data"
    assert _field_of_error(RunConfig(data=str(tmp_path / "notes.md"))) == "--data"
    assert _field_of_error(RunConfig(data=str(tmp_path / "empty"))) == "--data"


def test_a_missing_text_field_names_the_field(tmp_path):
    path = _write_corpus(tmp_path, "jsonl")
    assert _field_of_error(RunConfig(data=str(path), text_field="content")) == "--text-field"


def test_a_missing_or_unloadable_tokenizer_is_a_tokenizer_error(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    assert _field_of_error(RunConfig(tokenizer=str(tmp_path / "no_tokenizer"))) == "--tokenizer"
    assert _field_of_error(RunConfig(tokenizer=str(broken))) == "--tokenizer"


def test_text_data_for_a_task_other_than_causal_lm_says_use_synthetic():
    with pytest.raises(InputError, match="synthetic") as caught:
        build_data(RunConfig(data="builtin"), BERT, PLAN)
    assert caught.value.field == "--data"


def test_token_ids_beyond_the_model_vocabulary_are_refused(tmp_path):
    path = _write_corpus(tmp_path, "txt")
    large_vocabulary = _save_word_tokenizer(tmp_path / "tok", path, extra_words=2000)
    assert _field_of_error(RunConfig(data=str(path), tokenizer=str(large_vocabulary))) == "--tokenizer"
    small_model = dataclasses.replace(LLAMA, vocab_size=200)
    assert _field_of_error(RunConfig(data="builtin"), spec=small_model) == "--data"


def test_a_sequence_longer_than_the_model_positions_is_a_seq_len_error():
    assert _field_of_error(RunConfig(data="builtin"), plan=PLAN.replace(seq_len=10**6)) == "--seq-len"


def test_a_corpus_too_small_for_one_micro_batch_is_an_error(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("just a few words\n")
    with pytest.raises(InputError, match="too few") as caught:
        build_data(RunConfig(data=str(path)), LLAMA, PLAN)
    assert caught.value.field == "--data"
    with pytest.raises(InputError, match="too few"):
        build_data(RunConfig(data=str(_write_corpus(tmp_path, "txt"))), LLAMA, PLAN, world_size=1000)
