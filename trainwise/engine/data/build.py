"""build_data: from `--data` (and `--tokenizer`) to the micro-batches one rank trains on,
after checking that the data, the tokenizer and the model fit together."""

from __future__ import annotations

from pathlib import Path

import torch

from trainwise.engine.data.audio_folder import audio_folder_data
from trainwise.engine.data.builtin_corpus import SOURCE_NAME, builtin_documents
from trainwise.engine.data.chat import chat_data
from trainwise.engine.data.image_folder import image_folder_data
from trainwise.engine.data.order import EVAL_STREAM, MicroBatchOrder, mixed_seed
from trainwise.engine.data.source_check import check_data_source
from trainwise.engine.data.packing import MIN_ROW_TOKENS, PackedCorpus, held_out_batches, pack
from trainwise.engine.data.text_files import text_records
from trainwise.engine.data.token_cache import tokenized_corpus, tokenizer_workers
from trainwise.engine.data.tokens import ByteTokenizer, LocalTokenizer
from trainwise.engine.data.train_data import PackedMicroBatches, SyntheticMicroBatches, TrainData
from trainwise.engine.run_config import RunConfig
from trainwise.models import ModelSpec, check_seq_len, example_batch
from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan

TEXT_TASK = "causal-lm"


def build_data(run: RunConfig, spec: ModelSpec, plan: Plan, *, rank: int = 0, world_size: int = 1) -> TrainData:
    """The training data `run.data` names, for `spec`'s task, in micro-batches of
    `plan.batch_size` x `plan.seq_len` tokens; rank `rank` of `world_size` gets a
    disjoint share. Raises InputError naming the flag when something does not fit."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    check_seq_len(spec, plan.seq_len)
    check_data_source(run)
    if run.data == "synthetic":
        return _synthetic(run, spec, plan, rank, world_size)
    if spec.task == "image-cls" and run.data != "builtin":
        return image_folder_data(run, spec, plan, rank, world_size)
    if spec.task in ("ctc", "speech-seq2seq") and run.data != "builtin":
        return audio_folder_data(run, spec, plan, rank, world_size)
    return _text(run, spec, plan, rank, world_size)


def _synthetic(run: RunConfig, spec: ModelSpec, plan: Plan, rank: int, world_size: int) -> TrainData:
    documents = plan.packing == "documents"
    dataset = SyntheticMicroBatches(spec, plan.batch_size, plan.seq_len, run.seed, rank, world_size, documents,
                                    distinct=run.synthetic_batches)

    def evaluation(n: int) -> list:
        return [dataset.batch(mixed_seed(run.seed, EVAL_STREAM, i)) for i in range(n)]

    vocab = f", ids below {spec.vocab_size:,}" if spec.vocab_size else ""
    return TrainData(dataset, evaluation, description=f"synthetic random tokens for {spec.task}{vocab}: "
                                                      f"{plan.batch_size} x {plan.seq_len} tokens per micro-batch"
                                                      + ("; rows cut into random-length documents, attention "
                                                         "masked across them (--packing documents)"
                                                         if documents else "")
                                                      + (f"; the first {run.synthetic_batches} micro-batches, "
                                                         "repeated (--synthetic-batches)" if run.synthetic_batches
                                                         else ""),
                     tokens_per_micro_batch=plan.batch_size * plan.seq_len, micro_batches_per_epoch=None,
                     workers=plan.workers, pin_memory=plan.pin_memory, seed=run.seed)


def _text(run: RunConfig, spec: ModelSpec, plan: Plan, rank: int, world_size: int) -> TrainData:
    if spec.task != TEXT_TASK:
        other = " or pass --task causal-lm" if "causal-lm" in spec.allowed_tasks else ""
        raise InputError("--data", f"text data trains causal-lm models, and {spec.name} is set up for {spec.task}: "
                                   f"use --data synthetic{other}"
                                   + (" or a folder of class subfolders of images" if spec.task == "image-cls" else "")
                                   + (" or a folder of audio files with a metadata.csv"
                                      if spec.task in ("ctc", "speech-seq2seq") else ""))
    if run.chat:
        return chat_data(run, spec, plan, rank, world_size)
    tokenizer = LocalTokenizer(run.tokenizer) if run.tokenizer else ByteTokenizer()
    vocab_field = "--tokenizer" if run.tokenizer else "--data"
    _check_vocab(tokenizer.vocab_needed, f"{tokenizer.name} use", spec, vocab_field)
    document_end = _document_end(plan, tokenizer)
    stream, origin, text_bytes, read_note = _token_stream(run, tokenizer)
    if len(stream):
        _check_vocab(int(stream.max()) + 1, f"{origin} tokenised gives", spec, vocab_field)
    train_rows_needed = plan.batch_size * world_size
    # More --eval-batches can move rows from training to evaluation (up to 10% of them).
    packed = pack(stream, plan.seq_len, pad_id=tokenizer.eos_id or 0, train_rows_needed=train_rows_needed,
                  held_out_rows_wanted=run.eval_batches * plan.batch_size)
    _check_enough(packed, stream, origin, plan, train_rows_needed)
    with_mask = "attention_mask" in example_batch(spec, 1, 1)
    order = MicroBatchOrder(len(packed.train), plan.batch_size, run.seed, rank, world_size)
    return TrainData(PackedMicroBatches(packed.train, order, with_mask, document_end),
                     lambda n: held_out_batches(packed.held_out, plan.batch_size, n, with_mask, document_end),
                     description=_describe(origin, tokenizer.name, text_bytes, len(stream), packed, plan.seq_len)
                     + read_note + _PACKING_NOTES[plan.packing],
                     tokens_per_micro_batch=plan.batch_size * int(packed.train.lengths.max()),
                     micro_batches_per_epoch=order.per_epoch, workers=plan.workers, pin_memory=plan.pin_memory,
                     seed=run.seed)


def _token_stream(run: RunConfig, tokenizer) -> tuple[torch.Tensor, str, int, str]:
    """(token ids, where they came from, UTF-8 bytes of text, a note on how they were read).
    Files are tokenized once into a memory-mapped token file (engine/data/token_cache.py);
    the builtin corpus, under a megabyte, in memory."""
    if run.data == "builtin":
        documents = builtin_documents()
        return (tokenizer.stream(documents), f"builtin corpus ({SOURCE_NAME})",
                sum(len(d.encode("utf-8")) for d in documents), "")
    records, field = text_records(run.data, run.text_field, run.data_split)
    workers = tokenizer_workers(run.tokenize_workers, [Path(f) for f in records.files])
    corpus = tokenized_corpus(records.dataset, field, tokenizer, workers, document_ends=records.document_ends())
    how = ("token ids read from the cache (tokenized by an earlier run)" if corpus.cached
           else f"tokenized by {corpus.workers} process{'es' if corpus.workers > 1 else ''}")
    return corpus.stream, run.data, corpus.text_bytes, f"; {how}, memory-mapped"


_PACKING_NOTES = {"stream": "; documents joined by the end-of-document id, attention crosses them (--packing stream)",
                  "documents": "; attention and the loss stay inside each document (--packing documents)"}


def _document_end(plan: Plan, tokenizer) -> int | None:
    """The id that ends each document when the plan packs documents, else None."""
    if plan.packing != "documents":
        return None
    if tokenizer.eos_id is None:
        raise InputError("--packing", f"documents needs a tokenizer with an end-of-document (eos or sep) id; "
                                      f"{tokenizer.name} has neither: use --packing stream")
    return tokenizer.eos_id


def _check_vocab(ids_needed: int, what: str, spec: ModelSpec, field: str) -> None:
    if spec.vocab_size is not None and ids_needed > spec.vocab_size:
        raise InputError(field, f"{what} token ids up to {ids_needed - 1:,}, but {spec.name} takes ids below "
                                f"{spec.vocab_size:,}; pass --tokenizer DIR with the model's own tokenizer, "
                                "or use --data synthetic")


def _check_enough(packed: PackedCorpus, stream: torch.Tensor, origin: str, plan: Plan, rows_needed: int) -> None:
    rows = len(packed.train)
    if rows >= rows_needed and int(packed.train.lengths.max()) >= MIN_ROW_TOKENS:
        return
    raise InputError("--data", f"{origin} gives {len(stream):,} tokens, {rows} training sequence(s) of up to "
                               f"{plan.seq_len}: too few for {rows_needed} micro-batch row(s) "
                               f"({plan.batch_size} per rank); lower --seq-len or --batch-size, or add text")


def _describe(origin: str, tokenizer_name: str, text_bytes: int, tokens: int, packed: PackedCorpus,
              seq_len: int) -> str:
    return (f"{origin}, {tokenizer_name}: {text_bytes / 1e6:.2f} MB of text, {tokens:,} tokens; "
            f"{len(packed.train):,} training and {len(packed.held_out):,} held-out sequences of "
            f"{seq_len} tokens")
