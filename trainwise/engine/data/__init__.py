"""Training data for the engine: `build_data(run, spec, plan, rank=, world_size=)` -> TrainData.

    data = build_data(RunConfig(data="builtin"), resolve_model("tiny-llama"), plan)
    for batch in data.micro_batches(start=micro_batches_consumed): ...
    held_out = data.eval_batches(4)

Sources (`--data`): `synthetic`, random tokens for any task; `builtin`, real text
gathered from Python's own documentation (no download); or local files (.txt, .jsonl,
.csv, .parquet, a directory or glob of them, a save_to_disk directory) read through
`datasets`. Text is tokenised as UTF-8 bytes or with a local tokenizer (`--tokenizer DIR`)
and packed into full sequences (no padding); conversations (`--chat FIELD`) are formatted
with the tokenizer's chat template, one per row, the loss on the assistant turns only.
Which samples micro-batch k holds depends only on (seed, k, rank), so resuming at k is exact.

Files, one concept each: build.py (sources and checks), builtin_corpus.py, records.py
(local files as records, each with its file and row; a large .txt one per line),
text_files.py (records -> documents), chat.py (conversations -> masked rows), tokens.py
(bytes or a local tokenizer), packing.py (rows, held-out share, padding), order.py
(shuffling per epoch, rank shares), train_data.py (TrainData, DataLoader),
user_dataset.py (a tokenized datasets.Dataset), source_check.py (what can be checked
before any import of torch)."""


__all__ = ["build_data", "TrainData"]


def __getattr__(name: str):
    """build_data and TrainData, imported on first use: the command line checks --data
    (source_check.py) before torch and datasets are imported, so a typo is answered at once."""
    if name == "build_data":
        from trainwise.engine.data.build import build_data

        return build_data
    if name == "TrainData":
        from trainwise.engine.data.train_data import TrainData

        return TrainData
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
