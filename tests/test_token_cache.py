"""Data files are tokenized once, in several processes, into a memory-mapped token file:
the same ids as tokenizing in memory, the training rows a view of the file (no copy, so
a corpus larger than memory trains), and a second run tokenizes nothing."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from test_data import _save_word_tokenizer
from trainwise.engine.data.build import build_data
from trainwise.engine.data.text_files import read_documents, text_records
from trainwise.engine.data.token_cache import tokenized_corpus, tokenizer_workers
from trainwise.engine.data.tokens import ByteTokenizer, LocalTokenizer
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan

WORDS = "the cat sat on a mat while the dog ran past".split()


def _jsonl(path, rows: int = 300):
    with open(path, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"text": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 9))}) + "\n")
    return path


def _tokenizers(tmp_path, data):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(read_documents(str(data), "text")), encoding="utf-8")
    return [ByteTokenizer(), LocalTokenizer(str(_save_word_tokenizer(tmp_path / "tok", text)))]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_token_file_holds_the_ids_tokenizing_in_memory_gives(workers, tmp_path):
    data = _jsonl(tmp_path / "corpus.jsonl")
    records, field = text_records(str(data), "text")
    for tokenizer in _tokenizers(tmp_path, data):
        corpus = tokenized_corpus(records.dataset, field, tokenizer, workers, cache_dir=tmp_path / f"cache{workers}")
        expected = tokenizer.stream(read_documents(str(data), "text"))
        assert corpus.stream.dtype == torch.int32 and not corpus.cached
        assert torch.equal(corpus.stream.long(), expected), tokenizer.name
        assert corpus.documents == 300
        assert corpus.text_bytes == sum(len(d.encode()) for d in read_documents(str(data), "text"))


def test_a_second_run_reads_the_cache_and_tokenizes_nothing(tmp_path, monkeypatch):
    data = _jsonl(tmp_path / "corpus.jsonl")
    records, field = text_records(str(data), "text")
    first = tokenized_corpus(records.dataset, field, ByteTokenizer(), 1, cache_dir=tmp_path / "cache")

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(datasets.Dataset, "map", no_tokenizing)
    again, field = text_records(str(data), "text")
    second = tokenized_corpus(again.dataset, field, ByteTokenizer(), 1, cache_dir=tmp_path / "cache")
    assert second.cached and torch.equal(first.stream, second.stream)
    monkeypatch.undo()
    _jsonl(data, rows=301)  # the file changed: its records' fingerprint changes, so it is tokenized again
    changed, field = text_records(str(data), "text")
    third = tokenized_corpus(changed.dataset, field, ByteTokenizer(), 1, cache_dir=tmp_path / "cache")
    assert not third.cached and len(third.stream) > len(first.stream)


def test_training_rows_are_a_view_of_the_memory_mapped_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "cache"))
    data = _jsonl(tmp_path / "corpus.jsonl", rows=600)
    run = RunConfig(data=str(data), tokenize_workers=1)
    built = build_data(run, resolve_model("tiny-llama"), Plan(batch_size=2, seq_len=32))
    rows = built._dataset.rows.ids
    token_file = next((tmp_path / "cache" / "tokens").glob("*.int32"))
    assert rows.dtype == torch.int32 and _inside_mapping_of(token_file, rows.data_ptr())  # not a copy in memory
    batch = next(built.micro_batches())
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (2, 32)
    assert "tokenized by 1 process, memory-mapped" in built.description
    again = build_data(run, resolve_model("tiny-llama"), Plan(batch_size=2, seq_len=32))
    assert "read from the cache" in again.description
    assert torch.equal(next(again.micro_batches(start=5))["input_ids"],
                       list(zip(range(6), built.micro_batches()))[5][1]["input_ids"])


def _inside_mapping_of(file, address: int) -> bool:
    """Whether `address` lies in a region this process has mapped from `file` (Linux)."""
    for line in open("/proc/self/maps", encoding="utf-8"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(file.resolve()):
            start, end = (int(part, 16) for part in fields[0].split("-"))
            if start <= address < end:
                return True
    return False


def test_tokenizing_processes_follow_the_size_of_the_text(tmp_path):
    small = _jsonl(tmp_path / "small.jsonl", rows=10)
    assert tokenizer_workers(0, [small]) == 1
    assert tokenizer_workers(3, [small]) == 3  # asked for: done
