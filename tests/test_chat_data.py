"""Instruction data: `--chat FIELD` formats each conversation with the tokenizer's chat
template and puts the loss on the assistant turns only; the formats `--data` reads; bad
data named by file and row."""

from __future__ import annotations

import json

import pytest
import torch

from trainwise.engine.data import build_data
from trainwise.engine.data.chat import masked_conversation
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan import InputError, Plan

LLAMA = resolve_model("tiny-llama")
PLAN = Plan(device="cpu", batch_size=2, seq_len=32)
WORDS = "hi there hello friend bye see you later how are fine thanks what is two plus four".split()
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")
CONVERSATION = [{"role": "system", "content": "fine"}, {"role": "user", "content": "hi there"},
                {"role": "assistant", "content": "hello friend"}, {"role": "user", "content": "bye"},
                {"role": "assistant", "content": "see you later"}]


def chat_tokenizer_dir(tmp_path, template: str = TEMPLATE):
    """A word-level tokenizer with a chat template, saved locally (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[EOS]", "<system>", "<user>", "<assistant>", "<end>", *WORDS]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="[EOS]")
    fast.chat_template = template
    directory = tmp_path / "tok"
    fast.save_pretrained(directory)
    return directory, fast


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_only_the_assistant_turns_carry_the_loss(tmp_path):
    _, tokenizer = chat_tokenizer_dir(tmp_path)
    ids, labels = masked_conversation(tokenizer, CONVERSATION, "row 1")
    words = tokenizer.convert_ids_to_tokens(ids)
    learned = [word for word, label in zip(words, labels) if label != -100]
    # The assistant's words and the end marker it must learn to emit; never a role header,
    # the system or user words, or the generation prompt.
    assert learned == ["hello", "friend", "<end>", "see", "you", "later", "<end>"]
    assert all(label in (-100, token) for label, token in zip(labels, ids))


def test_chat_file_trains_masked_rows(tmp_path):
    directory, _ = chat_tokenizer_dir(tmp_path)
    data_file = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 6)
    data = build_data(RunConfig(data=str(data_file), tokenizer=str(directory), chat="messages"), LLAMA, PLAN)
    batch = next(data.micro_batches())
    assert batch["input_ids"].shape[0] == 2
    kept = batch["labels"][batch["labels"] != -100]
    assert kept.numel() == 2 * 7  # the 7 assistant tokens of each conversation, nothing else
    assert "6 conversations" in data.description and "of which 42 assistant tokens" in data.description


@pytest.mark.parametrize("kind", ["csv", "saved", "glob"])
def test_more_formats_are_read(tmp_path, kind):
    from datasets import Dataset, DatasetDict

    lines = [f"record {i} says the quick brown fox jumps again and again" for i in range(200)]
    if kind == "csv":
        source = tmp_path / "corpus.csv"
        Dataset.from_dict({"text": lines}).to_csv(str(source))
    elif kind == "saved":
        source = tmp_path / "saved"
        DatasetDict({"train": Dataset.from_dict({"text": lines}), "test": Dataset.from_dict({"text": lines[:5]})}) \
            .save_to_disk(str(source))
    else:
        for part in range(2):
            write_jsonl(tmp_path / f"part-{part}.jsonl", [{"text": t} for t in lines[part::2]])
        source = tmp_path / "part-*.jsonl"
    data = build_data(RunConfig(data=str(source)), LLAMA, PLAN)
    assert next(data.micro_batches())["input_ids"].shape == (2, 32)


@pytest.mark.fault
@pytest.mark.parametrize("case, setup, field, named", [
    ("an empty row", lambda p: write_jsonl(p / "d.jsonl", [{"text": "fine"}, {"text": "  "}]), "--data", "d.jsonl row 2"),
    ("non-UTF-8 bytes", lambda p: (p / "d.txt").write_bytes(b"good line\n\xff\xfe bad\n") and p / "d.txt",
     "--data", "d.txt row 2"),
    ("a line that is not JSON", lambda p: (p / "d.jsonl").write_text('{"text": "a"}\n\n{"text": b}\n') and p / "d.jsonl",
     "--data", "d.jsonl line 3 is not one JSON object"),
    ("a conversation without an assistant turn", lambda p: write_jsonl(p / "c.jsonl", [
        {"messages": CONVERSATION}, {"messages": [{"role": "user", "content": "hi"}]}]), "--chat", "c.jsonl row 2"),
    ("a message without a role", lambda p: write_jsonl(p / "c.jsonl", [{"messages": [{"content": "hi"}]}]),
     "--chat", "message 1"),
    ("a missing split", None, "--data-split", "its splits: train"),
])
def test_bad_data_is_named_by_file_and_row(tmp_path, fault_log, case, setup, field, named):
    directory, _ = chat_tokenizer_dir(tmp_path)
    if setup is None:
        from datasets import Dataset, DatasetDict

        DatasetDict({"train": Dataset.from_dict({"text": ["a b c"] * 4})}).save_to_disk(str(tmp_path / "saved"))
        run = RunConfig(data=str(tmp_path / "saved"), data_split="validation")
    else:
        path = setup(tmp_path)
        run = RunConfig(data=str(path), tokenizer=str(directory), chat="messages" if field == "--chat" else None)
    with pytest.raises(InputError) as caught:
        build_data(run, LLAMA, PLAN)
    assert caught.value.field == field and named in caught.value.message
    fault_log(kind="bad input", case=f"--data: {case}", exit_code=2, message=str(caught.value))


@pytest.mark.fault
def test_chat_without_a_template_or_a_file_is_refused(tmp_path, fault_log):
    directory, _ = chat_tokenizer_dir(tmp_path, template="")
    data_file = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 4)
    for run, text in ((RunConfig(data=str(data_file), tokenizer=str(directory), chat="messages"), "no chat template"),
                      (RunConfig(data="builtin", chat="messages"), "--data FILE")):
        with pytest.raises(InputError) as caught:
            build_data(run, LLAMA, PLAN)
        assert caught.value.field == "--chat" and text in caught.value.message
        fault_log(kind="bad input", case=f"--chat: {text}", exit_code=2, message=str(caught.value))


def test_train_fine_tunes_on_a_chat_file(tmp_path, capsys):
    from trainwise.cli.main import main

    directory, _ = chat_tokenizer_dir(tmp_path)
    data_file = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 8)
    metrics = tmp_path / "m.jsonl"
    code = main(["train", "tiny-llama", "--device", "cpu", "--data", str(data_file), "--chat", "messages",
                 "--tokenizer", str(directory), "--steps", "3", "--seq-len", "32", "--batch-size", "2",
                 "--metrics", str(metrics), "--no-chart"])
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert code == 0 and "assistant tokens carry the loss" in out
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if '"step"' in line]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_a_chat_runs_summary_says_that_padding_to_the_longest_row_explains_its_lower_memory():
    from types import SimpleNamespace

    from rich.console import Console

    from trainwise.cli.render_train import padding_note, render_summary

    summary = {"steps": 3, "time_s": 5.0, "samples_per_s": 2.0, "tokens_per_s": 38.0, "peak_allocated": 4 << 20,
               "final_loss": 6.7, "memory_method": "cpu"}
    chat = SimpleNamespace(summary=summary, predicted={"peak_allocated": 5 << 20}, plan=SimpleNamespace(seq_len=64),
                           run=SimpleNamespace(chat="messages"), outcome=None)
    console = Console(width=400, record=True)
    render_summary(chat, console)
    text = console.export_text()
    assert "memory predicted for full rows of 64 tokens" in text and "averaged 19 tokens (measured)" in text
    assert padding_note(SimpleNamespace(**{**vars(chat), "run": SimpleNamespace(chat=None)})) is None
