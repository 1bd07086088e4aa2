"""A text file larger than LINE_RECORDS_ABOVE_BYTES is read one record per line, so its
memory is bounded by the token cache, not the text: the byte tokens equal those of the
whole file, bad lines are named by file and line, held-out rows are a view of the token
file, and training, evaluation and an exact resume work across it. The threshold is
lowered here so that files of a few kilobytes are read by line."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from test_token_cache import _inside_mapping_of
from trainwise.api import train
from trainwise.cli.main import main
from trainwise.engine.data import records as records_module
from trainwise.engine.data.packing import pack
from trainwise.engine.data.text_files import text_records
from trainwise.engine.data.token_cache import tokenized_corpus
from trainwise.engine.data.tokens import BYTE_EOS, ByteTokenizer
from trainwise.engine.preemption import Preempted
from trainwise.engine.run_config import RunConfig
from trainwise.plan import InputError, Plan

SMALL_THRESHOLD = 4096
# Blank lines, a line of spaces, non-ASCII text, a Windows line end and no final newline:
# what a line-by-line read must give back exactly.
LINES = [f"line {i}: naïve café {'über ' * (i % 5)}the fox" if i % 7 else "" for i in range(600)]
TEXT = "\n".join(LINES[:300]) + "\n   \n" + "\r\n".join(LINES[300:302]) + "\n" + "\n".join(LINES[302:])


@pytest.fixture
def by_line(monkeypatch, tmp_path):
    """Files over SMALL_THRESHOLD bytes are read by line; the caches stay in tmp_path."""
    monkeypatch.setattr(records_module, "LINE_RECORDS_ABOVE_BYTES", SMALL_THRESHOLD)
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "cache"))


def _whole_file_stream(source: str, cache) -> torch.Tensor:
    records, field = text_records(source, "text")
    assert not any(records.by_line)
    return tokenized_corpus(records.dataset, field, ByteTokenizer(), 1, cache_dir=cache).stream


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_read_by_line_gives_the_byte_tokens_of_the_whole_file(tmp_path, monkeypatch, workers):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a small file, read whole\n", encoding="utf-8")
    (tmp_path / "data" / "b.txt").write_bytes(TEXT.encode("utf-8"))
    (tmp_path / "data" / "c.txt").write_text(TEXT[:5000], encoding="utf-8")
    source = str(tmp_path / "data" / "*.txt")
    whole = _whole_file_stream(source, tmp_path / "whole")

    monkeypatch.setattr(records_module, "LINE_RECORDS_ABOVE_BYTES", SMALL_THRESHOLD)
    records, field = text_records(source, "text")
    assert records.by_line == (False, True, True) and len(records.dataset) > 600
    corpus = tokenized_corpus(records.dataset, field, ByteTokenizer(), workers, cache_dir=tmp_path / "lines",
                              document_ends=records.document_ends())
    assert torch.equal(corpus.stream, whole)  # one end id per file, after its last line
    assert int((corpus.stream == BYTE_EOS).sum()) == corpus.documents == 3
    assert corpus.text_bytes == sum(len(f.read_bytes().replace(b"\r\n", b"\n")) for f in (tmp_path / "data").iterdir())


def test_a_global_row_maps_back_to_its_file_and_line(tmp_path, by_line):
    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text(TEXT, encoding="utf-8")
    records, _ = text_records(str(tmp_path / "*.txt"), "text")
    second = records.file_starts[1]
    assert records.file_starts == (0, second) and second == TEXT.count("\n") + 1
    assert records.where(second + 4) == f"{tmp_path / 'b.txt'} line 5"
    assert records.dataset[second + 4]["text"] == LINES[4] + "\n"
    assert records.document_ends() == (second - 1, len(records.dataset) - 1)


def test_a_bad_line_in_a_large_file_is_named_by_file_and_line(tmp_path, by_line, capsys):
    path = tmp_path / "big.txt"
    lines = [line.encode() + b"\n" for line in LINES]
    lines[456] = b"broken \xff\xfe bytes\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(InputError, match="big.txt line 457 is not UTF-8") as caught:
        text_records(str(path), "text")
    assert caught.value.field == "--data"
    code = main(["train", "tiny-llama", "--device", "cpu", "--steps", "1", "--seq-len", "32", "--data", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--data" in err[0] and "big.txt line 457" in err[0], err


def test_a_large_file_of_only_blank_lines_is_refused(tmp_path, by_line):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "data" / "blank.txt").write_text("\n  \n\t\n" * 2000, encoding="utf-8")
    with pytest.raises(InputError, match="blank.txt holds only blank lines") as caught:
        text_records(str(tmp_path / "data"), "text")
    assert caught.value.field == "--data"


def test_held_out_rows_are_a_view_of_the_token_file_and_evaluation_trains(tmp_path, by_line):
    path = tmp_path / "big.txt"
    path.write_text(TEXT * 3, encoding="utf-8")
    records, field = text_records(str(path), "text")
    corpus = tokenized_corpus(records.dataset, field, ByteTokenizer(), 1, document_ends=records.document_ends())
    packed = pack(corpus.stream, 64, pad_id=BYTE_EOS, train_rows_needed=4, held_out_rows_wanted=8)
    token_file = next((tmp_path / "cache" / "tokens").glob("*.int32"))
    held = packed.held_out.full.ids
    assert len(held) >= 8 and held.dtype == torch.int32 and _inside_mapping_of(token_file, held.data_ptr())
    assert torch.equal(held[0], corpus.stream[len(packed.train) * 64:][:64])

    run = RunConfig(data=str(path), steps=4, eval_every=2, eval_batches=2)
    result = train("tiny-llama", str(path), Plan(device="cpu", batch_size=2, seq_len=64), run)
    assert result.outcome.eval_loss is not None and 0 < result.outcome.eval_loss < 20
    assert "tokenized by" in result.data_description or "read from the cache" in result.data_description


def _losses(data: str, run: RunConfig, stop_after: int | None = None) -> list[float]:
    losses = []

    def record(entry):
        losses.append(entry.outcome.loss)
        if entry.step == stop_after:
            os.kill(os.getpid(), signal.SIGUSR1)

    train("tiny-gpt2", data, Plan(device="cpu", batch_size=2, seq_len=16), run, on_step=record)
    return losses


def test_a_resumed_run_repeats_the_losses_across_a_file_read_by_line(tmp_path, by_line):
    path = tmp_path / "big.txt"
    path.write_text(TEXT, encoding="utf-8")
    uninterrupted = _losses(str(path), RunConfig(steps=4, deterministic=True))
    run = RunConfig(steps=4, output=str(tmp_path / "out"), deterministic=True)
    with pytest.raises(Preempted):
        _losses(str(path), run, stop_after=2)
    resumed = _losses(str(path), run.replace(resume=True))
    assert resumed == pytest.approx(uninterrupted[2:], rel=1e-6, abs=0)
