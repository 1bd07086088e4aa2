"""`--data DIR` for a speech model: .wav files and a metadata.csv of transcripts, tokenized
with the model's tokenizer, shaped as the model takes them, checked before training."""

from __future__ import annotations

import csv
import json
import wave

import numpy as np
import pytest
import torch

from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.data.build import build_data
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SENTENCES = ["hello world", "good day", "a cat sat", "the dog ran"]


def _wav(path, samples: int, rate: int = 16_000, seed: int = 0):
    tone = np.sin(np.arange(samples) * (0.05 + 0.02 * seed)) * 0.3
    noise = np.random.default_rng(seed).standard_normal(samples) * 0.05
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(rate)
        out.writeframes(((tone + noise) * 32767).astype(np.int16).tobytes())


def _folder(root, clips: int = 12, samples: int = 3000, rate: int = 16_000):
    root.mkdir(parents=True)
    rows = []
    for i in range(clips):
        _wav(root / f"{i}.wav", samples - 50 * (i % 4), rate, seed=i % 4)
        rows.append((f"{i}.wav", SENTENCES[i % 4]))
    with open(root / "metadata.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["file_name", "transcription"])
        writer.writerows(rows)
    return root


def _ctc_tokenizer(directory):
    from transformers import Wav2Vec2CTCTokenizer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4, **{c: 5 + i for i, c in enumerate(LETTERS)}}
    directory.mkdir()
    (directory / "vocab.json").write_text(json.dumps(vocab))
    Wav2Vec2CTCTokenizer(str(directory / "vocab.json")).save_pretrained(directory)
    return directory


def _word_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for s in SENTENCES for w in s.split()})
    tokenizer = Tokenizer(models.WordLevel({w: 3 + i for i, w in enumerate(words)} | {"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(directory)
    return directory


def test_ctc_batches_are_normalised_padded_samples_and_character_labels(tmp_path):
    data = _folder(tmp_path / "speech")
    run = RunConfig(data=str(data), tokenizer=str(_ctc_tokenizer(tmp_path / "tok")))
    built = build_data(run, resolve_model("tiny-wav2vec2"), Plan(batch_size=4, seq_len=4000))
    batch = next(built.micro_batches())
    assert batch["input_values"].shape == (4, 4000)
    assert (batch["input_values"][:, 3000:] == 0).all()  # zero padding after the longest clip
    for row in batch["input_values"]:
        real = row[:int(row.nonzero().max()) + 1]  # the clip, before its zero padding
        assert len(real) in (3000, 2950, 2900, 2850)
        assert abs(float(real.mean())) < 1e-3 and abs(float(real.std()) - 1) < 1e-2
    assert batch["labels"].max() < 32 and (batch["labels"] == -100).any()  # transcripts of unequal length
    assert "12 clips" in built.description and "16,000 Hz" in built.description


@pytest.mark.parametrize("model, seq_len, make_tokenizer", [("tiny-wav2vec2", 4000, _ctc_tokenizer),
                                                            ("tiny-whisper", 8, _word_tokenizer)])
def test_a_speech_model_learns_its_transcripts_in_twenty_steps(model, seq_len, make_tokenizer, tmp_path):
    metrics = tmp_path / "m.jsonl"
    run = RunConfig(data=str(_folder(tmp_path / "speech", samples=3000 if model == "tiny-wav2vec2" else 2000)),
                    tokenizer=str(make_tokenizer(tmp_path / "tok")), steps=20, metrics=str(metrics), no_chart=True)
    train(model, plan=Plan(device="cpu", batch_size=4, seq_len=seq_len, lr=2e-3, warmup_steps=0), run=run)
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if '"step"' in line]
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:2]) / 2, losses


def test_whisper_gets_log_mel_features_of_its_window(tmp_path):
    data = _folder(tmp_path / "speech", samples=2000)
    run = RunConfig(data=str(data), tokenizer=str(_word_tokenizer(tmp_path / "tok")))
    batch = next(build_data(run, resolve_model("tiny-whisper"), Plan(batch_size=2, seq_len=8)).micro_batches())
    assert batch["input_features"].shape == (2, 16, 128) and batch["input_features"].dtype == torch.float32
    assert batch["labels"].shape[0] == 2 and int(batch["labels"].max()) < 1024


@pytest.mark.fault
@pytest.mark.parametrize("case, argv_extra, words", [
    ("no metadata.csv", [], "has no metadata.csv"),
    ("a clip at 8 kHz", [], "is 8,000 Hz; tiny-wav2vec2 takes 16,000 Hz audio"),
    ("a clip longer than --seq-len", ["--seq-len", "1000"], "more than the 1,000 the model takes"),
    ("no --tokenizer", ["--no-tokenizer"], "pass --tokenizer DIR"),
])
def test_speech_data_that_does_not_fit_the_model_is_refused_before_training(case, argv_extra, words, tmp_path,
                                                                            capsys, fault_log):
    data = _folder(tmp_path / "speech", clips=4, rate=8_000 if "8 kHz" in case else 16_000)
    if case == "no metadata.csv":
        (data / "metadata.csv").unlink()
    argv = ["train", "tiny-wav2vec2", "--data", str(data), "--steps", "1", "--seq-len", "4000"]
    if "--no-tokenizer" not in argv_extra:
        argv += ["--tokenizer", str(_ctc_tokenizer(tmp_path / "tok"))]
    argv += [a for a in argv_extra if a != "--no-tokenizer"]
    code = main(argv)
    err = capsys.readouterr().err
    fault_log(kind="bad input", case=f"train a CTC model on speech data with {case}", exit_code=code,
              message=err.strip().splitlines()[-1].replace(str(tmp_path), "TMP"))
    assert code == 2 and words in err and "Traceback" not in err
