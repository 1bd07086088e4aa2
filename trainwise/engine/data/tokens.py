"""Turning documents into one token stream: UTF-8 bytes, or a local Hugging Face tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from trainwise.plan.errors import InputError

BYTE_EOS = 256  # ends each document in the byte vocabulary (bytes are 0..255)
BYTE_VOCAB = 257


class ByteTokenizer:
    """UTF-8 bytes as token ids; needs no files and suits any model with >= 257 ids."""

    name = "byte tokens"
    eos_id = BYTE_EOS
    vocab_needed = BYTE_VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class LocalTokenizer:
    """A tokenizer from a local directory (never downloaded; its remote code never runs)."""

    def __init__(self, directory: str):
        from transformers import AutoTokenizer

        path = Path(directory).expanduser()
        if not path.is_dir():
            raise InputError("--tokenizer", f"no tokenizer directory at {directory}")
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except (OSError, ValueError, KeyError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise InputError("--tokenizer", f"cannot load a tokenizer from {directory}: {first}") from None
        self.name = f"tokenizer {path.name}"
        eos = self._tokenizer.eos_token_id
        self.eos_id = eos if eos is not None else self._tokenizer.sep_token_id
        self.vocab_needed = len(self._tokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=False)["input_ids"]


def token_stream(documents: Iterable[str], tokenizer) -> torch.Tensor:
    """All documents' tokens in order, each followed by the end-of-document id (int64)."""
    ids: list[int] = []
    for text in documents:
        ids.extend(tokenizer.encode(text))
        if tokenizer.eos_id is not None:
            ids.append(tokenizer.eos_id)
    return torch.tensor(ids, dtype=torch.long)
