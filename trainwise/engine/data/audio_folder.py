"""Speech data from a folder (`--data DIR` for a ctc or speech-seq2seq model): audio files
with a metadata.csv whose `file_name` column names each file and whose `transcription`
column holds its text (the layout of `datasets`' audiofolder), transcripts tokenized with
`--tokenizer DIR` (the model's own tokenizer, e.g. Wav2Vec2's characters or Whisper's).

.wav files (PCM, any channels: averaged to mono) are read with Python's `wave` module;
other formats go through `datasets.Audio`, whose decoder (torchcodec) is an optional
package, refused with its install line when missing. Audio must be at the model's
sampling rate (its preprocessor_config.json, else 16 kHz): resampling changes the data,
so a file at another rate is refused, named.

A CTC model takes the raw samples, normalised to zero mean and unit variance (as
Wav2Vec2's feature extractor does), zero-padded to `--seq-len` samples; Whisper takes
log-mel features of its full window (transformers' WhisperFeatureExtractor, numpy only).
A clip longer than the input allows, or a transcript longer than `--seq-len` decoder
tokens, is refused before training, naming the file: cutting either would train on a
transcript that does not match its audio."""

from __future__ import annotations

import csv
import json
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainwise.common.errors import InputError
from trainwise.engine.data.order import MicroBatchOrder, mixed_seed
from trainwise.engine.data.tokens import LocalTokenizer
from trainwise.engine.data.train_data import TrainData
from trainwise.hardware.installation import installed
from trainwise.models.task_inputs import mel_window

DEFAULT_SAMPLING_RATE = 16_000
WHISPER_HOP = 160  # samples per log-mel frame (Whisper's feature extractor)
IGNORE_INDEX = -100
HELD_OUT_STREAM = 5


@dataclass(frozen=True)
class Clip:
    file: Path
    samples: np.ndarray  # float32, mono, in [-1, 1]
    labels: list[int]


class SpeechMicroBatches(Dataset):
    """Micro-batch number -> the task's inputs and labels (padded with -100)."""

    def __init__(self, clips: list[Clip], order: MicroBatchOrder, inputs):
        self.clips, self.order, self.inputs = clips, order, inputs

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        return speech_batch([self.clips[i] for i in self.order.rows(number).tolist()], self.inputs)


def speech_batch(clips: list[Clip], inputs) -> dict[str, torch.Tensor]:
    width = max(len(clip.labels) for clip in clips)
    labels = torch.full((len(clips), width), IGNORE_INDEX, dtype=torch.long)
    for row, clip in enumerate(clips):
        labels[row, :len(clip.labels)] = torch.tensor(clip.labels, dtype=torch.long)
    return {**inputs(clips), "labels": labels}


def audio_folder_data(run, spec, plan, rank: int, world_size: int) -> TrainData:
    """TrainData from `run.data`'s audio and transcripts for a ctc or speech-seq2seq `spec`."""
    root = Path(run.data).expanduser()
    if not run.tokenizer:
        raise InputError("--tokenizer", f"a {spec.task} model learns transcripts: pass --tokenizer DIR with the "
                                        "model's own tokenizer (local files)")
    tokenizer = LocalTokenizer(run.tokenizer).hf_tokenizer
    rate = _sampling_rate(spec)
    clips = [_clip(root, name, text, rate, tokenizer, spec, plan.seq_len) for name, text in _metadata(root)]
    held = min(max(run.eval_batches * plan.batch_size, len(clips) // 50), len(clips) // 10)
    generator = torch.Generator().manual_seed(mixed_seed(run.seed, HELD_OUT_STREAM))
    permutation = torch.randperm(len(clips), generator=generator).tolist()
    held_out, train = [clips[i] for i in sorted(permutation[:held])], [clips[i] for i in sorted(permutation[held:])]
    if len(train) < plan.batch_size * world_size:
        raise InputError("--data", f"{root} has {len(train)} training clip(s): too few for {world_size} "
                                   f"micro-batch(es) of {plan.batch_size}")
    order = MicroBatchOrder(len(train), plan.batch_size, run.seed, rank, world_size)
    inputs = _WhisperFeatures(spec.config) if spec.task == "speech-seq2seq" else _RawAudio(plan.seq_len)
    seconds = sum(len(clip.samples) for clip in clips) / rate
    description = (f"{root}: {len(clips):,} clips, {seconds:,.1f} s of audio at {rate:,} Hz, transcripts tokenized "
                   f"with {Path(run.tokenizer).name}; {len(train):,} training and {len(held_out):,} held-out")
    return TrainData(SpeechMicroBatches(train, order, inputs),
                     lambda n: [speech_batch(held_out[s:s + plan.batch_size], inputs)
                                for s in range(0, len(held_out), plan.batch_size)[:n]],
                     description=description, tokens_per_micro_batch=plan.batch_size * plan.seq_len,
                     micro_batches_per_epoch=order.per_epoch, workers=plan.workers, pin_memory=plan.pin_memory,
                     seed=run.seed)


class _RawAudio:
    """CTC input: normalised samples, zero-padded to --seq-len."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, clips: list[Clip]) -> dict[str, torch.Tensor]:
        values = torch.zeros((len(clips), self.length), dtype=torch.float32)
        for row, clip in enumerate(clips):
            samples = clip.samples - clip.samples.mean()
            values[row, :len(samples)] = torch.from_numpy(samples / np.sqrt(samples.var() + 1e-7))
        return {"input_values": values}


class _WhisperFeatures:
    """Whisper input: log-mel features of the model's whole window."""

    def __init__(self, config):
        from transformers import WhisperFeatureExtractor

        bins, frames = mel_window(config)
        self.extractor = WhisperFeatureExtractor(feature_size=bins)
        self.extractor.n_samples, self.extractor.nb_max_frames = frames * WHISPER_HOP, frames

    def __call__(self, clips: list[Clip]) -> dict[str, torch.Tensor]:
        features = self.extractor([clip.samples for clip in clips], sampling_rate=DEFAULT_SAMPLING_RATE,
                                  return_tensors="np")["input_features"]
        return {"input_features": torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))}


def _metadata(root: Path) -> list[tuple[str, str]]:
    table = root / "metadata.csv"
    if not root.is_dir() or not table.is_file():
        raise InputError("--data", f"a speech model trains on a folder of audio files with a metadata.csv "
                                   f"(file_name, transcription) or on --data synthetic; {root} has no metadata.csv")
    with open(table, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for number, row in enumerate(rows, 2):  # line 1 is the header
        if not row.get("file_name") or not (row.get("transcription") or "").strip():
            raise InputError("--data", f"{table} line {number}: needs a file_name and a non-blank transcription")
    if not rows:
        raise InputError("--data", f"{table} lists no clips")
    return [(row["file_name"], row["transcription"]) for row in rows]


def _clip(root: Path, name: str, text: str, rate: int, tokenizer, spec, seq_len: int) -> Clip:
    file = root / name
    samples, file_rate = _read_audio(file)
    if file_rate != rate:
        raise InputError("--data", f"{file} is {file_rate:,} Hz; {spec.name} takes {rate:,} Hz audio: resample it")
    limit = seq_len if spec.task == "ctc" else mel_window(spec.config)[1] * WHISPER_HOP
    if len(samples) > limit:
        raise InputError("--seq-len" if spec.task == "ctc" else "--data",
                         f"{file} has {len(samples):,} samples, more than the {limit:,} the model takes"
                         + (" (--seq-len): raise it" if spec.task == "ctc" else " (Whisper's window): cut the clip"))
    labels = _labels(tokenizer, text, spec)
    if spec.task == "speech-seq2seq" and len(labels) > seq_len:
        raise InputError("--seq-len", f"{file}'s transcript is {len(labels)} tokens, more than --seq-len {seq_len}")
    return Clip(file, samples, labels)


def _labels(tokenizer, text: str, spec) -> list[int]:
    if spec.task == "ctc":
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = tokenizer(text)["input_ids"]  # Whisper's prefix tokens and end of text, as its fine-tuning uses
    start = spec.config.decoder_start_token_id
    return ids[1:] if ids and ids[0] == start else ids  # the model prepends the start token itself


def _read_audio(file: Path) -> tuple[np.ndarray, int]:
    if not file.is_file():
        raise InputError("--data", f"{file} (named in metadata.csv) does not exist")
    if file.suffix.lower() == ".wav":
        try:
            return _read_wav(file)
        except (wave.Error, EOFError) as error:
            raise InputError("--data", f"{file}: not a PCM .wav file ({error})") from None
    if not installed("torchcodec"):
        raise InputError("--data", f"{file}: decoding {file.suffix} needs the torchcodec package "
                                   "(pip install torchcodec); .wav files need nothing")
    import datasets

    decoded = datasets.Audio().decode_example({"path": str(file), "bytes": None})
    samples = np.asarray(decoded["array"], dtype=np.float32)
    return (samples.mean(axis=0) if samples.ndim > 1 else samples), int(decoded["sampling_rate"])


def _read_wav(file: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(file), "rb") as audio:
        width, channels, rate = audio.getsampwidth(), audio.getnchannels(), audio.getframerate()
        frames = audio.readframes(audio.getnframes())
    if width not in (1, 2, 4):
        raise wave.Error(f"{8 * width}-bit samples")
    kind = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    samples = np.frombuffer(frames, dtype=kind).astype(np.float32)
    samples = (samples - 128.0) / 128.0 if width == 1 else samples / float(np.iinfo(kind).max)
    return samples.reshape(-1, channels).mean(axis=1), rate


def _sampling_rate(spec) -> int:
    if spec.source == "directory":
        settings = Path(spec.name).expanduser() / "preprocessor_config.json"
        if settings.is_file():
            return int(json.loads(settings.read_text(encoding="utf-8")).get("sampling_rate", DEFAULT_SAMPLING_RATE))
    return DEFAULT_SAMPLING_RATE
