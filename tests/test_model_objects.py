"""`trainwise.api.train(model=..., data=...)` with what a Trainer user already has: a
transformers model they built (trained in place, its memory predicted from its config) and
a tokenized `datasets.Dataset`."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from trainwise.api import train
from trainwise.common.errors import InputError
from trainwise.engine.run_config import RunConfig
from trainwise.models.catalog import find_record
from trainwise.plan import Plan

PLAN = Plan(batch_size=2, seq_len=16, device="cpu")


def tiny_config(name: str = "tiny-llama"):
    return AutoConfig.for_model(**copy.deepcopy(find_record(name).hf_config))


def token_rows(count: int, vocab: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 24, (count,), generator=generator)  # some longer than --seq-len 16
    return {"input_ids": [torch.randint(0, vocab, (int(n),), generator=generator).tolist() for n in lengths]}


@pytest.mark.slow
def test_a_built_causal_lm_and_a_tokenized_dataset_train_in_place_with_a_prediction():
    torch.manual_seed(0)
    config = tiny_config()
    model = AutoModelForCausalLM.from_config(config)
    before = model.lm_head.weight.detach().clone()
    dataset = Dataset.from_dict(token_rows(12, config.vocab_size))
    result = train(model, data=dataset, plan=PLAN, run=RunConfig(steps=3))
    assert result.model is model or getattr(result.model, "module", None) is model
    assert not torch.equal(model.lm_head.weight.detach(), before)  # the caller's weights were trained
    assert result.predicted and result.predicted["peak_allocated"] > 0  # predicted from the object's config
    assert "datasets.Dataset of 12 tokenized rows" in result.data_description
    assert "cut to it" in result.data_description  # rows longer than --seq-len are said to be cut
    assert result.summary["final_loss"] is not None


def test_a_classifier_object_reads_the_label_column():
    torch.manual_seed(0)
    config = tiny_config("tiny-bert")
    config.num_labels = 3
    model = AutoModelForSequenceClassification.from_config(config)
    rows = token_rows(8, config.vocab_size)
    rows["label"] = [i % 3 for i in range(8)]
    result = train(model, data=Dataset.from_dict(rows), plan=PLAN, run=RunConfig(steps=2))
    assert result.summary["final_loss"] is not None


@pytest.mark.fault
def test_an_untokenized_dataset_is_refused_naming_its_columns(fault_log):
    model = AutoModelForCausalLM.from_config(tiny_config())
    with pytest.raises(InputError) as caught:
        train(model, data=Dataset.from_dict({"text": ["a", "b", "c", "d"]}), plan=PLAN, run=RunConfig(steps=1))
    assert caught.value.field == "data" and "input_ids" in caught.value.message and "text" in caught.value.message
    fault_log(kind="bad input", case="api.train with an untokenized datasets.Dataset", exit_code=2,
              message=str(caught.value))


@pytest.mark.fault
def test_a_plan_that_names_other_attention_than_the_built_model_is_refused(fault_log):
    model = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="eager")
    dataset = Dataset.from_dict(token_rows(8, model.config.vocab_size))
    with pytest.raises(InputError) as caught:
        train(model, data=dataset, plan=PLAN, run=RunConfig(steps=1))
    assert caught.value.field == "plan.attention" and "'eager'" in caught.value.message
    fault_log(kind="bad input", case="api.train: a built model's attention differs from the plan's", exit_code=2,
              message=str(caught.value))
