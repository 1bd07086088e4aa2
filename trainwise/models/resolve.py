"""Turn what the user typed as MODEL into a ModelSpec.

MODEL may be, in this order of precedence:
1. a local Hugging Face model directory (a folder with ``config.json``);
2. a catalog name or Hub id, any case (``gpt2``, ``meta-llama/Llama-3.1-8B``);
3. ``package.module:function`` returning ``(model, batch)``;
4. any other Hub id (``owner/name``): its config.json only, from the local Hugging Face
   cache or fetched (`models/hub_config.py`); the weights start at random.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PretrainedConfig

from trainwise.models.catalog import CatalogRecord, find_record, is_model_directory, unknown_model_error
from trainwise.models.config_checks import check_config_sizes, config_field_error
from trainwise.models.function_models import import_model_function, looks_like_function_reference
from trainwise.models.hub_config import hub_config_folder, looks_like_hub_id
from trainwise.models.positions import position_limit
from trainwise.models.spec import ModelSpec
from trainwise.models.task_inputs import check_task_inputs, image_shape
from trainwise.models.tasks import (FUNCTION_TASK, TASKS, allowed_tasks, choose_task, config_for_task, infer_task,
                                   task_of_model_class)
from trainwise.common.errors import InputError

_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")


def resolve_model(name: str, task: str | None = None, trust_remote_code: bool = False) -> ModelSpec:
    """Resolve MODEL to a ModelSpec; `task` overrides the model's usual task.

    A directory's own Python code (``auto_map`` in its config) runs only with
    `trust_remote_code`. Raises InputError ("MODEL" or "--task") for bad input.
    """
    if task is not None and task not in TASKS:
        raise InputError("--task", f"unknown task '{task}'; allowed: {', '.join(TASKS)}")
    path = Path(name).expanduser()
    if is_model_directory(name):
        return _from_directory(name, path, task, trust_remote_code)
    record = find_record(name)
    if record is not None:
        return _from_catalog(record, task)
    if looks_like_function_reference(name):
        return _from_function(name, task)
    if path.is_dir():
        raise InputError("MODEL", f"directory '{name}' has no config.json (a Hugging Face model directory needs one)")
    if name.startswith(_PATH_PREFIXES):
        raise InputError("MODEL", f"no model directory at '{name}'")
    if looks_like_hub_id(name):
        return _from_hub(name, task, trust_remote_code)
    raise unknown_model_error(name)


def resolve_model_object(model, task: str | None = None) -> ModelSpec | None:
    """The ModelSpec of a transformers model the caller built (its config, its class's task),
    so its memory can be predicted and trainwise's data fitted to it; None for any other
    module (its forward brings its own loss and batches)."""
    config = getattr(model, "config", None)
    if not isinstance(config, PretrainedConfig):
        return None
    usual = task_of_model_class(config, type(model).__name__)
    if usual is None:
        return None
    chosen = choose_task(type(model).__name__, config, task, usual=usual)
    return _spec_from_config(type(model).__name__, "object", config, chosen,
                             hf_name=getattr(config, "_name_or_path", None) or None)


def _from_catalog(record: CatalogRecord, task: str | None) -> ModelSpec:
    config = AutoConfig.for_model(**copy.deepcopy(record.hf_config))  # configs may edit nested dicts
    chosen = choose_task(record.name, config, task, usual=record.task)
    return _spec_from_config(record.name, "catalog", config, chosen, hf_name=record.hf_name, tiny=record.tiny)


def _from_directory(name: str, path: Path, task: str | None, trust_remote_code: bool) -> ModelSpec:
    config = _read_directory_config(name, path, trust_remote_code)
    chosen = choose_task(name, config, task, usual=infer_task(config))
    return _spec_from_config(name, "directory", config, chosen, trust_remote_code=trust_remote_code)


def _from_hub(name: str, task: str | None, trust_remote_code: bool) -> ModelSpec:
    folder = hub_config_folder(name)
    config = _read_directory_config(name, folder, trust_remote_code)
    chosen = choose_task(name, config, task, usual=infer_task(config))
    return _spec_from_config(name, "hub", config, chosen, hf_name=name, trust_remote_code=trust_remote_code)


def _read_directory_config(name: str, path: Path, trust_remote_code: bool) -> PretrainedConfig:
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError("MODEL", f"cannot read {path / 'config.json'}: {error}") from error
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except StrictDataclassError as error:  # transformers' own check of a field's type or value
        raise config_field_error(path / "config.json", error) from None
    except (ValueError, KeyError, OSError, ImportError) as error:
        if raw.get("auto_map") and not trust_remote_code:
            raise InputError(
                "MODEL",
                f"'{name}' needs its own Python code (auto_map in config.json); "
                "pass --trust-remote-code if you trust that code",
            ) from error
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError("MODEL", f"cannot load the config in '{name}': {reason}") from error
    check_config_sizes(config, path / "config.json")
    return config


def _from_function(name: str, task: str | None) -> ModelSpec:
    if task is not None:
        raise InputError("--task", f"a model function brings its own loss; drop --task for {name}")
    function = import_model_function(name)
    return ModelSpec(
        name=name, source="function", task=FUNCTION_TASK, family=None, config=None,
        max_positions=None, vocab_size=None, function=function,
    )


def _spec_from_config(
    name: str,
    source: str,
    config: PretrainedConfig,
    task: str,
    hf_name: str | None = None,
    tiny: bool = False,
    trust_remote_code: bool = False,
) -> ModelSpec:
    config = config_for_task(config, task)
    check_task_inputs(name, config, task)
    return ModelSpec(
        name=name,
        source=source,
        task=task,
        family=config.model_type,
        config=config,
        max_positions=image_shape(config).patches if task == "image-cls" else position_limit(config).max_positions,
        vocab_size=getattr(config.get_text_config(), "vocab_size", None),
        hf_name=hf_name,
        allowed_tasks=allowed_tasks(config),
        tiny=tiny,
        trust_remote_code=trust_remote_code,
    )
