"""Whether a model's family and shapes can be cut as a layout asks: an InputError naming
the flag, before any process starts or any estimate is traced. The family part is here;
the arithmetic on sizes and batches is plan/partition.py's."""

from __future__ import annotations

from trainwise.models.families import ModelFamily, family_of, model_types_with
from trainwise.common.errors import InputError
from trainwise.plan.partition import (check_layout_combination, check_pipeline, check_tensor_parallel_sizes,
                                      pipeline_microbatches)


def check_model_layout(config, plan, layout) -> None:
    """Every layout check for `plan` on `layout`: the knobs' combination, then the model's
    family and shapes."""
    check_layout_combination(plan, layout)
    check_tensor_parallel(config, layout.tp, layout.sequence_parallel)
    if layout.pp > 1:
        pipeline_family(config)
    check_pipeline(config, layout.pp, plan.pp_schedule, pipeline_microbatches(plan, layout.pp), plan.batch_size)


def check_tensor_parallel(config, tp: int, sequence_parallel: bool = False) -> ModelFamily | None:
    """The family tensor parallel cuts `config`'s model by (None for tp 1); InputError
    ("--tp" or "--sequence-parallel") when this architecture or its sizes cannot be split
    `tp` ways (and, with sequence parallel, over the sequence)."""
    if tp == 1:
        return None
    model_type = getattr(config, "model_type", "?")
    family = family_of(config)
    if sequence_parallel and (family is None or family.sequence_parallel is None):
        raise InputError("--sequence-parallel", f"shards a tensor-parallel model over the sequence: "
                                                f"{_listed(model_types_with('sequence_parallel'))}; not {model_type}")
    if family is None:
        supported = ", ".join(sorted(model_types_with("tensor_parallel")))
        raise InputError("--tp", f"tensor parallel supports {supported}; not {model_type}")
    check_tensor_parallel_sizes(config, tp)
    return family


def pipeline_family(config) -> ModelFamily:
    """The family whose pipeline parts and stage cut `config`'s model; InputError("--pp")
    where pipelining is not implemented for it."""
    family = family_of(config)
    if family is None or family.pipeline is None:
        raise InputError("--pp", f"pipeline parallel supports the {', '.join(model_types_with('pipeline'))} "
                                 f"decoders; not {getattr(config, 'model_type', '?')}")
    return family


def _listed(names: list[str]) -> str:
    """"a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
