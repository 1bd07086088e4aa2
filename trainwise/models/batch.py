"""One synthetic micro-batch shaped as a model's task expects it."""

from __future__ import annotations

import inspect

import torch

from trainwise.models.documents import as_documents, random_document_starts
from trainwise.models.function_models import call_model_function
from trainwise.models.media_batch import media_batch
from trainwise.models.positions import check_seq_len
from trainwise.models.spec import ModelSpec
from trainwise.models.tasks import head_model_class

MASKED_FRACTION = 0.15  # share of positions a masked-LM batch asks the model to predict
IGNORE_INDEX = -100  # label value the transformers losses skip


def example_batch(
    spec: ModelSpec,
    batch_size: int,
    seq_len: int,
    device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
    documents: bool = False,
) -> dict[str, torch.Tensor] | torch.Tensor:
    """A random micro-batch of `batch_size` sequences of `seq_len` tokens for `spec`.

    Keys: ``input_ids`` (ids in [0, vocab_size)), ``attention_mask`` (all ones) when the
    model takes one, and ``labels`` for the task: the input ids (causal-lm), one class
    id per sequence (seq-cls), `seq_len` decoder target ids (seq2seq) or ids at about
    15% of positions and -100 elsewhere (masked-lm), one class id per token (token-cls).
    Images, audio and vision-language batches: models/media_batch.py. Random draws use `generator` (a CPU
    generator) and are then moved to `device`. Model functions return their own batch.
    `documents` (causal-lm, `--packing documents`): each row is cut into random-length
    documents, with position_ids restarting at each and no attention_mask (documents.py).
    """
    if spec.source == "function":
        return call_model_function(spec.function, batch_size, seq_len, device)[1]
    check_seq_len(spec, seq_len)
    media = media_batch(spec, batch_size, seq_len, generator)
    if media is not None:
        return {key: tensor.to(device) for key, tensor in media.items()}
    shape = (batch_size, seq_len)
    input_ids = _random_ids(spec.vocab_size, shape, generator)
    batch = {"input_ids": input_ids}
    if _takes_attention_mask(spec):
        batch["attention_mask"] = torch.ones(shape, dtype=torch.long)
    batch["labels"] = _labels(spec, input_ids, generator)
    if documents:
        if spec.task != "causal-lm":
            raise ValueError(f"packed documents are causal-lm rows, not {spec.task!r}")
        batch = as_documents(input_ids, batch["labels"], random_document_starts(shape, generator))
    return {key: tensor.to(device) for key, tensor in batch.items()}


def _random_ids(vocab_size: int, shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=generator, dtype=torch.long, device="cpu")


def _labels(spec: ModelSpec, input_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    batch_size, seq_len = input_ids.shape
    if spec.task == "causal-lm":
        return input_ids.clone()  # the model shifts labels itself
    if spec.task == "seq-cls":
        return torch.randint(0, spec.config.num_labels, (batch_size,), generator=generator, dtype=torch.long)
    if spec.task == "seq2seq":
        return _random_ids(spec.vocab_size, (batch_size, seq_len), generator)
    if spec.task == "masked-lm":
        return _masked_labels(input_ids, generator)
    if spec.task == "token-cls":
        return torch.randint(0, spec.config.num_labels, (batch_size, seq_len), generator=generator, dtype=torch.long)
    raise ValueError(f"no example labels for task {spec.task!r}")


def _masked_labels(input_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    batch_size, seq_len = input_ids.shape
    masked = torch.rand(input_ids.shape, generator=generator) < MASKED_FRACTION
    # At least one target per sequence, so the loss is never an average over nothing.
    forced = torch.randint(0, seq_len, (batch_size,), generator=generator)
    masked[torch.arange(batch_size), forced] = True
    return torch.where(masked, input_ids, torch.full_like(input_ids, IGNORE_INDEX))


def _takes_attention_mask(spec: ModelSpec) -> bool:
    model_class = head_model_class(spec.config, spec.task)
    if model_class is None:  # remote code: transformers-style models all take one
        return True
    return "attention_mask" in inspect.signature(model_class.forward).parameters
