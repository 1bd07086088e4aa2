"""Training data for the engine: `build_data(run, spec, plan)` -> TrainData.

Sources (`--data`): `synthetic` random tokens for any task; `builtin` a real text corpus
gathered from Python's own documentation (no download); a .txt/.jsonl/.parquet file or
directory read through `datasets`. Text is tokenised as UTF-8 bytes or with a local
tokenizer (`--tokenizer DIR`) and packed into full sequences (no padding)."""

from __future__ import annotations

import torch

from trainwise.engine.data.builtin_corpus import SOURCE_NAME, builtin_documents
from trainwise.engine.data.order import MicroBatchOrder
from trainwise.engine.data.text_files import read_documents
from trainwise.engine.data.tokens import ByteTokenizer, LocalTokenizer, token_stream
from trainwise.engine.data.train_data import (TrainData, _PackedMicroBatches, _SyntheticMicroBatches,
                                              packed_batch)
from trainwise.engine.run_config import RunConfig
from trainwise.models import ModelSpec, check_seq_len, example_batch
from trainwise.plan.errors import InputError
from trainwise.plan.plan import Plan

HELD_OUT_SHARE = 0.02  # of the packed sequences, kept for evaluation
EVAL_SEED_OFFSET = 10**9  # synthetic evaluation batches come from numbers training never reaches

__all__ = ["build_data", "TrainData"]


def build_data(run: RunConfig, spec: ModelSpec, plan: Plan, *, rank: int = 0, world_size: int = 1) -> TrainData:
    """The training data `run.data` names, shaped for `spec`'s task and `plan`'s batch."""
    check_seq_len(spec, plan.seq_len)
    if run.data == "synthetic":
        dataset = _SyntheticMicroBatches(spec, plan, run.seed)
        evaluation = lambda n: [dataset[EVAL_SEED_OFFSET + i] for i in range(n)]  # noqa: E731
        return TrainData(dataset, evaluation, plan, f"synthetic random tokens ({spec.task})", rank, world_size)
    if spec.task != "causal-lm":
        raise InputError("--data", f"text data trains causal-lm models; {spec.name} is set up for {spec.task}: "
                                   "use --data synthetic, or --task causal-lm where the model allows it")
    tokenizer = LocalTokenizer(run.tokenizer) if run.tokenizer else ByteTokenizer()
    if spec.vocab_size is not None and tokenizer.vocab_needed > spec.vocab_size:
        raise InputError("--tokenizer", f"{tokenizer.name} needs {tokenizer.vocab_needed} token ids but "
                                        f"{spec.name} has {spec.vocab_size}; use a tokenizer matching the model")
    if run.data == "builtin":
        documents, origin = builtin_documents(), f"builtin corpus ({SOURCE_NAME})"
    else:
        documents, origin = read_documents(run.data, run.text_field), run.data
    stream = token_stream(documents, tokenizer)
    sequences = stream[: len(stream) // plan.seq_len * plan.seq_len].view(-1, plan.seq_len)
    held_out = max(1, int(len(sequences) * HELD_OUT_SHARE)) if len(sequences) > plan.batch_size else 0
    train_sequences, eval_sequences = sequences[: len(sequences) - held_out], sequences[len(sequences) - held_out:]
    if len(train_sequences) < plan.batch_size * world_size:
        raise InputError("--data", f"{origin} gives {len(stream):,} tokens, {len(train_sequences)} sequences of "
                                   f"{plan.seq_len}: too few for a micro-batch of {plan.batch_size} per rank; "
                                   "lower --seq-len or --batch-size, or add text")
    with_mask = "attention_mask" in example_batch(spec, 1, 8)
    dataset = _PackedMicroBatches(train_sequences, MicroBatchOrder(len(train_sequences), plan.batch_size, run.seed),
                                  with_mask)

    def evaluation(n: int) -> list:
        rows = [eval_sequences[i:i + plan.batch_size] for i in range(0, len(eval_sequences), plan.batch_size)]
        return [packed_batch(r, with_mask) for r in rows[:n]]

    megabytes = sum(len(d.encode("utf-8")) for d in documents) / 1e6
    description = (f"{origin}, {tokenizer.name}: {megabytes:.2f} MB, {len(train_sequences):,} training and "
                   f"{len(eval_sequences):,} held-out sequences of {plan.seq_len} tokens")
    return TrainData(dataset, evaluation, plan, description, rank, world_size)
