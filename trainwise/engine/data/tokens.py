"""Turning documents into one token stream: UTF-8 bytes, or a local Hugging Face tokenizer.

Either way each document is followed by the tokenizer's end-of-document id, so packed
rows can cross document boundaries and the model still sees where one text ends."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from trainwise.common.errors import InputError, first_line

BYTE_EOS = 256  # ends each document in the byte vocabulary (bytes are 0..255)
BYTE_VOCAB = 257
_NEVER_IN_UTF8 = b"\xff"  # a byte no UTF-8 text contains: a safe stand-in for BYTE_EOS
ENCODE_CHUNK = 1000  # documents per call into a fast tokenizer (it batches in Rust)


class ByteTokenizer:
    """UTF-8 bytes as token ids; needs no files and suits any model with >= 257 ids."""

    name = "byte tokens"
    eos_id = BYTE_EOS
    vocab_needed = BYTE_VOCAB

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's UTF-8 bytes (no end id: the caller adds it)."""
        return [list(text.encode("utf-8")) for text in texts]

    def identity(self) -> str:
        """What decides the ids, for cache keys."""
        return "utf-8 bytes, end 256"

    def stream(self, documents: Sequence[str]) -> torch.Tensor:
        """All documents' bytes in order, each followed by BYTE_EOS (int64)."""
        if not documents:
            return torch.zeros(0, dtype=torch.long)
        joined = bytearray(_NEVER_IN_UTF8.join(d.encode("utf-8") for d in documents) + _NEVER_IN_UTF8)
        ids = torch.frombuffer(joined, dtype=torch.uint8).long()
        return ids.masked_fill_(ids == _NEVER_IN_UTF8[0], BYTE_EOS)


class LocalTokenizer:
    """A tokenizer from a local directory: never downloaded, and its own code never runs."""

    def __init__(self, directory: str):
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise InputError("--tokenizer", f"no tokenizer directory at {directory}; pass a local directory "
                                            "holding tokenizer.json (or omit --tokenizer for byte tokens)")
        from transformers import AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False,
                                                            local_files_only=True)
        except Exception as err:  # noqa: BLE001 - transformers and tokenizers raise many kinds
            raise InputError("--tokenizer", f"cannot load a tokenizer from {directory} ({first_line(err)}); pass "
                                            "a directory saved by save_pretrained or holding tokenizer.json") from None
        self.name = f"tokenizer {path.name}"
        tokenizer = self._tokenizer
        self.eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        self.vocab_needed = len(tokenizer)

    @property
    def hf_tokenizer(self):
        """The transformers tokenizer itself (chat templates, special tokens)."""
        return self._tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, without special tokens (no end id: the caller adds it)."""
        # verbose=False: documents longer than the tokenizer's model_max_length are
        # expected here (they are packed into rows later), so no warning about it.
        return self._tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False,
                               verbose=False)["input_ids"]

    def identity(self) -> str:
        """What decides the ids (its serialised vocabulary and rules), for cache keys."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        return backend.to_str() if backend is not None else repr(sorted(self._tokenizer.get_vocab().items()))

    def stream(self, documents: Sequence[str]) -> torch.Tensor:
        """All documents' token ids in order, each followed by the end-of-document id
        (eos, else sep; nothing when the tokenizer has neither)."""
        separator = [] if self.eos_id is None else [self.eos_id]
        pieces: list[list[int]] = []
        for start in range(0, len(documents), ENCODE_CHUNK):
            for ids in self.encode_batch(documents[start:start + ENCODE_CHUNK]):
                pieces.extend((ids, separator))
        total = sum(len(piece) for piece in pieces)
        ids = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=total)
        return torch.from_numpy(ids)
