"""Write examples/chat-tokenizer/: a word-level tokenizer with a chat template, holding
every word of examples/chat.jsonl, so the chat example trains on a tiny catalog model with
no download. A real fine-tune uses the chat model's own tokenizer (--tokenizer ./MODEL).

    python examples/chat_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIAL = ["[UNK]", "[EOS]", "<system>", "<user>", "<assistant>", "<end>"]
# Each turn as "<role> words <end>"; only the assistant's words and its <end> carry the loss.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")


def words(jsonl: Path) -> list[str]:
    seen = {}
    for line in jsonl.read_text().splitlines():
        for message in json.loads(line)["messages"]:
            seen.update(dict.fromkeys(message["content"].split()))
    return list(seen)


def build(jsonl: Path = HERE / "chat.jsonl", out: Path = HERE / "chat-tokenizer") -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {word: index for index, word in enumerate(SPECIAL + words(jsonl))}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="[EOS]")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(f"wrote {build()}")
