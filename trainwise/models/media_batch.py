"""One synthetic micro-batch for the tasks beyond text: random images, audio or log-mel
features of the shapes the model's config gives (models/task_inputs.py), with labels of
the task's kind. Random draws use the caller's CPU generator, so a seed reproduces them."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from trainwise.models.documents import IGNORE_INDEX
from trainwise.models.task_inputs import image_shape, image_token_count, mel_window, transcript_length



def media_batch(spec, batch_size: int, seq_len: int,
                generator: torch.Generator | None) -> dict[str, torch.Tensor] | None:
    """The micro-batch for `spec`'s task (a ModelSpec) on the CPU, or None for a text task."""
    config, task = spec.config, spec.task
    if task == "image-cls":
        return {"pixel_values": _images(config, batch_size, generator),
                "labels": _classes(config, (batch_size,), generator)}
    if task == "speech-seq2seq":
        bins, frames = mel_window(config)
        return {"input_features": torch.randn((batch_size, bins, frames), generator=generator),
                "labels": _ids(spec.vocab_size, (batch_size, seq_len), generator)}
    if task == "ctc":
        return {"input_values": torch.randn((batch_size, seq_len), generator=generator),
                "labels": _transcripts(config, batch_size, seq_len, generator)}
    if task == "vision-lm":
        return _image_then_text(spec, batch_size, seq_len, generator)
    return None


def _images(config: PretrainedConfig, batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
    shape = image_shape(config)
    return torch.randn((batch_size, shape.channels, shape.height, shape.width), generator=generator)


def _classes(config: PretrainedConfig, shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    return torch.randint(0, config.num_labels, shape, generator=generator, dtype=torch.long)


def _ids(vocab_size: int, shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=generator, dtype=torch.long)


def _transcripts(config: PretrainedConfig, batch_size: int, samples: int,
                 generator: torch.Generator | None) -> torch.Tensor:
    """Character ids for CTC, never the padding id (CTC's blank)."""
    blank = config.pad_token_id if config.pad_token_id is not None else 0
    labels = _ids(config.vocab_size - 1, (batch_size, transcript_length(config, samples)), generator)
    return labels + (labels >= blank).long()  # skip over the blank's id


def _image_then_text(spec, batch_size: int, seq_len: int, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """LLaVA's layout: one token, the image's tokens, then text; no loss on image tokens."""
    config = spec.config
    image_token = config.image_token_index
    input_ids = _ids(spec.vocab_size, (batch_size, seq_len), generator)
    input_ids[input_ids == image_token] = (image_token + 1) % spec.vocab_size
    input_ids[:, 1:1 + image_token_count(config)] = image_token
    labels = input_ids.masked_fill(input_ids == image_token, IGNORE_INDEX)
    return {"input_ids": input_ids, "pixel_values": _images(config, batch_size, generator),
            "attention_mask": torch.ones((batch_size, seq_len), dtype=torch.long), "labels": labels}
