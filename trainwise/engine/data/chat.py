"""Conversations (`--chat FIELD`): each record's FIELD is a list of {role, content}
messages, formatted with the tokenizer's own chat template into one training row whose
loss covers the assistant turns only.

Which tokens an assistant turn owns is read from the template itself: the conversation up
to that turn rendered with the generation prompt ends where the turn's tokens begin, and
the conversation through the turn ends where they end. Everything else (system and user
turns, role headers, the generation prompt) gets label -100. This needs a template that
renders conversations prefix by prefix (the common ones do); one that does not is refused
rather than masked wrongly. Rows then train as a tokenized dataset (user_dataset.py):
padded per micro-batch, never packed across conversations."""

from __future__ import annotations

from trainwise.common.errors import InputError
from trainwise.engine.data.records import load_records
from trainwise.engine.data.train_data import TrainData
from trainwise.engine.data.user_dataset import IGNORE_INDEX, user_dataset_data
from trainwise.models import ModelSpec

ROLES = ("system", "user", "assistant", "tool")


def chat_data(run, spec: ModelSpec, plan, rank: int, world_size: int) -> TrainData:
    """TrainData of the conversations in `run.data` (InputError naming file and row)."""
    tokenizer = chat_tokenizer(run.tokenizer)
    records = load_records(run.data, run.data_split)
    if run.chat not in records.dataset.column_names:
        raise InputError("--chat", f"{run.data} has no field {run.chat!r}; its fields: "
                                   f"{', '.join(records.dataset.column_names)}")
    rows = {"input_ids": [], "labels": []}
    for index, messages in enumerate(records.dataset[run.chat]):
        check_conversation(messages, records.where(index))
        ids, labels = masked_conversation(tokenizer, messages, records.where(index))
        rows["input_ids"].append(ids)
        rows["labels"].append(labels)
    vocab = max(len(tokenizer), max((max(r) for r in rows["input_ids"] if r), default=0) + 1)
    if spec.vocab_size is not None and vocab > spec.vocab_size:
        raise InputError("--tokenizer", f"{run.tokenizer} has {vocab:,} token ids, but {spec.name} takes ids below "
                                        f"{spec.vocab_size:,}: use the model's own tokenizer")
    import datasets

    data = user_dataset_data(datasets.Dataset.from_dict(rows), spec, plan, run, rank, world_size)
    trained = sum(label != IGNORE_INDEX for labels in rows["labels"] for label in labels)
    total = sum(len(ids) for ids in rows["input_ids"])
    data.description = (f"chat {run.data} ({run.chat!r}, {len(rows['input_ids']):,} conversations, "
                        f"{total:,} tokens of which {trained:,} assistant tokens carry the loss), "
                        f"{data.description.split('), ', 1)[-1]}")
    return data


def chat_tokenizer(directory: str | None):
    """The local tokenizer of `directory`, which must carry a chat template."""
    if not directory:
        raise InputError("--chat", "needs --tokenizer DIR: the model's tokenizer, whose chat template formats the "
                                   "conversations")
    from trainwise.engine.data.tokens import LocalTokenizer

    tokenizer = LocalTokenizer(directory).hf_tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("--chat", f"the tokenizer in {directory} has no chat template "
                                   "(tokenizer_config.json chat_template); use the chat model's tokenizer")
    return tokenizer


def check_conversation(messages, where: str) -> None:
    """A list of {role, content} messages with at least one assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise InputError("--chat", f"{where}: expected a non-empty list of {{role, content}} messages")
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict) or message.get("role") not in ROLES \
                or not isinstance(message.get("content"), str):
            raise InputError("--chat", f"{where}, message {number}: needs a role ({', '.join(ROLES)}) and text "
                                       "content")
    if not any(m["role"] == "assistant" for m in messages):
        raise InputError("--chat", f"{where}: no assistant turn, so nothing to learn from")


def masked_conversation(tokenizer, messages: list[dict], where: str) -> tuple[list[int], list[int]]:
    """(token ids, labels) of one conversation: labels equal the ids on assistant turns, -100 elsewhere."""
    ids = _render(tokenizer, messages, False)
    labels = [IGNORE_INDEX] * len(ids)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:turn], True)
        through = _render(tokenizer, messages[:turn + 1], False)
        if ids[:len(through)] != through or through[:len(before)] != before or len(before) > len(through):
            raise InputError("--chat", f"{where}: the tokenizer's chat template does not render this conversation "
                                       "prefix by prefix, so the assistant tokens cannot be told apart")
        labels[len(before):len(through)] = ids[len(before):len(through)]
    return ids, labels


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    if not messages:  # an assistant turn first: only the generation prompt precedes it
        try:
            return list(tokenizer.apply_chat_template([], tokenize=True, add_generation_prompt=generation_prompt,
                                                      return_dict=False))
        except Exception:  # noqa: BLE001 - templates may index messages[0]; then nothing precedes the turn
            return []
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                              return_dict=False))
