"""Training tasks: which `transformers` head a model gets and which tasks a family allows.

A task names the head put on the backbone and therefore the loss:

- ``causal-lm``  next-token prediction (``AutoModelForCausalLM``)
- ``seq-cls``    one label per sequence (``AutoModelForSequenceClassification``)
- ``seq2seq``    encoder-decoder generation (``AutoModelForSeq2SeqLM``)
- ``masked-lm``  fill in masked tokens (``AutoModelForMaskedLM``)
- ``token-cls``  one label per token (``AutoModelForTokenClassification``)
- ``image-cls``  one label per image (``AutoModelForImageClassification``: ViT, Swin, ConvNeXt...)
- ``speech-seq2seq``  audio features in, text out (``AutoModelForSpeechSeq2Seq``: Whisper)
- ``ctc``        raw audio in, characters out by CTC (``AutoModelForCTC``: Wav2Vec2, HuBERT...)
- ``vision-lm``  a causal LM that reads an image first (``AutoModelForImageTextToText``: LLaVA)

What a sample of each task is made of (images, audio, image tokens) is read from the config
in `models/task_inputs.py`.

Model functions (``package.module:function``) bring their own loss; their task is
``FUNCTION_TASK``.
"""

from __future__ import annotations

import copy

import transformers
from transformers import PretrainedConfig
from transformers.models.auto import modeling_auto

from trainwise.common.errors import InputError

TASKS: tuple[str, ...] = ("causal-lm", "seq-cls", "seq2seq", "masked-lm", "token-cls", "image-cls", "speech-seq2seq",
                          "ctc", "vision-lm")
FUNCTION_TASK = "custom"

AUTO_CLASS_NAMES: dict[str, str] = {
    "causal-lm": "AutoModelForCausalLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "masked-lm": "AutoModelForMaskedLM",
    "token-cls": "AutoModelForTokenClassification",
    "image-cls": "AutoModelForImageClassification",
    "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
    "ctc": "AutoModelForCTC",
    "vision-lm": "AutoModelForImageTextToText",
}

# model_type -> head class name, as transformers registers them.
_HEAD_CLASS_NAMES: dict[str, dict[str, str]] = {
    "causal-lm": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    "seq-cls": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    "seq2seq": modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    "masked-lm": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    "token-cls": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    "image-cls": modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    "speech-seq2seq": modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
    "ctc": modeling_auto.MODEL_FOR_CTC_MAPPING_NAMES,
    "vision-lm": modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
}

# The tasks each kind of architecture is trained for; a registered head outside these
# (e.g. BERT's causal-LM head, T5's classification head) is not offered.
_KIND_TASKS: dict[str, tuple[str, ...]] = {
    "encoder-decoder": ("seq2seq",),
    "encoder": ("seq-cls", "masked-lm", "token-cls"),
    "decoder": ("causal-lm", "seq-cls", "token-cls"),
    "vision": ("image-cls",),
    "speech-encoder-decoder": ("speech-seq2seq",),
    "speech-encoder": ("ctc",),
    "vision-language": ("vision-lm",),
}
_KIND_DEFAULT_TASK = {"encoder-decoder": "seq2seq", "encoder": "seq-cls", "decoder": "causal-lm",
                      "vision": "image-cls", "speech-encoder-decoder": "speech-seq2seq", "speech-encoder": "ctc",
                      "vision-language": "vision-lm"}


def auto_class(task: str):
    """The ``transformers`` Auto class that builds a model with the head for `task`."""
    return getattr(transformers, AUTO_CLASS_NAMES[task])


def head_model_class(config: PretrainedConfig, task: str):
    """The concrete class `auto_class(task)` builds for `config`; None for remote code."""
    try:
        model_class = auto_class(task)._model_mapping[type(config)]
    except (KeyError, ValueError):
        return None
    if isinstance(model_class, (list, tuple)):  # several classes share one config type
        model_class = model_class[0]
    return model_class


def architecture_kind(config: PretrainedConfig) -> str:
    """"vision" (an image classifier), "speech-encoder-decoder" (Whisper), "speech-encoder"
    (a CTC model), "vision-language" (an image-text-to-text model that is not also a plain
    causal LM), else "encoder-decoder", "encoder" (has a masked-LM head) or "decoder"."""
    model_type = config.model_type
    if model_type in _HEAD_CLASS_NAMES["image-cls"] and model_type not in _HEAD_CLASS_NAMES["masked-lm"]:
        return "vision"
    if model_type in _HEAD_CLASS_NAMES["speech-seq2seq"]:
        return "speech-encoder-decoder"
    if model_type in _HEAD_CLASS_NAMES["ctc"]:
        return "speech-encoder"
    if model_type in _HEAD_CLASS_NAMES["vision-lm"] and model_type not in _HEAD_CLASS_NAMES["causal-lm"]:
        return "vision-language"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if config.model_type in _HEAD_CLASS_NAMES["masked-lm"]:
        return "encoder"
    return "decoder"


def allowed_tasks(config: PretrainedConfig) -> tuple[str, ...]:
    """Tasks this configuration can be built for, in `TASKS` order."""
    auto_map = getattr(config, "auto_map", None) or {}
    remote = {task for task, cls in AUTO_CLASS_NAMES.items() if cls in auto_map}
    registered = {task for task in TASKS if config.model_type in _HEAD_CLASS_NAMES[task]}
    wanted = set(_KIND_TASKS[architecture_kind(config)])
    return tuple(task for task in TASKS if task in remote or (task in registered and task in wanted))


def infer_task(config: PretrainedConfig) -> str:
    """The task a configuration was saved for (its ``architectures``), else its kind's usual one."""
    allowed = allowed_tasks(config)
    for architecture in getattr(config, "architectures", None) or ():
        for task in allowed:
            if _HEAD_CLASS_NAMES[task].get(config.model_type) == architecture:
                return task
    default = _KIND_DEFAULT_TASK[architecture_kind(config)]
    if default in allowed or not allowed:
        return default
    return allowed[0]


def task_of_model_class(config: PretrainedConfig, class_name: str) -> str | None:
    """The task whose head `class_name` is for `config`'s family (None: a backbone without
    a head, or a class transformers does not register)."""
    for task in TASKS:
        if _HEAD_CLASS_NAMES[task].get(config.model_type) == class_name:
            return task
    return None


def choose_task(model_name: str, config: PretrainedConfig, requested: str | None, usual: str) -> str:
    """`requested` when this model supports it, `usual` when nothing was requested.

    Raises InputError naming ``--task`` and the tasks this model allows, or ``MODEL`` when
    it allows none (an image or speech model: building it would fail inside transformers).
    """
    allowed = allowed_tasks(config)
    if not allowed:
        raise InputError("MODEL", f"{model_name} is a {config.model_type} model, which has none of the heads "
                                  f"trainwise trains: {', '.join(TASKS)} (`trainwise models` lists the catalog)")
    if requested is None:
        return usual
    if requested not in allowed:
        choices = ", ".join(allowed) if allowed else "none"
        raise InputError("--task", f"'{requested}' is not available for {model_name}; allowed: {choices}")
    return requested


def config_for_task(config: PretrainedConfig, task: str) -> PretrainedConfig:
    """A copy of `config` ready for `task`.

    Decoder classification heads pick the last non-padding token, so they need a
    padding id; models released without one get their end-of-sequence id (or 0).
    """
    config = copy.deepcopy(config)
    if task == "seq-cls" and getattr(config, "pad_token_id", None) is None:
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        config.pad_token_id = eos if eos is not None else 0
    return config
