"""`trainwise train`, decided before any process trains: the demo run's knobs, the run
settings checked, the device `--plan auto` chooses for, and what the launching process
checks before torchrun starts a worker.

Imported before torch: the checks that need neither torch nor transformers (reports, the
data source) run first, so a typo in a path is answered at once; the rest import on use."""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.engine.run_config import RunConfig
from trainwise.plan.auto_request import AutoRequest
from trainwise.plan.plan import Plan

DEFAULT_MODEL = "tiny-llama"
# With no MODEL, the demo run: a small model on the built-in corpus, with a learning rate
# at which its loss falls visibly within the default 100 steps (flags still override).
DEMO_KNOBS = {"lr": 3e-3, "warmup_steps": 10}


def demo_plan(model: str | None, plan: Plan, named: set[str]) -> Plan:
    """`plan` with the demo run's knobs where MODEL was not given and the user named none of
    them (`named`: the knobs set by a flag or the plan file)."""
    if model is not None:
        return plan
    return plan.replace(**{k: v for k, v in DEMO_KNOBS.items() if k not in named})


@dataclass(frozen=True)
class CheckedRun:
    """The run settings, checked: the job's processes on all nodes (--nnodes x --nproc) and
    the restart warning to print (None: none)."""

    world: int
    warning: str | None


def check_run(run_config: RunConfig, plan: Plan) -> CheckedRun:
    """Refuse run settings that cannot work, before any process starts; the torch-free
    checks first (before the heavy imports and any search)."""
    # Imported here: `trainwise estimate` registers train's flags, which imports this module.
    from trainwise.engine.data.source_check import check_data_source
    from trainwise.engine.reports import check_reports

    check_reports(run_config)
    check_data_source(run_config)
    from trainwise.engine.checkpoint_saves import check_async_request
    from trainwise.engine.parallel.mesh import under_torchrun
    from trainwise.engine.parallel.nodes import check_nodes
    from trainwise.engine.parallel.restarts import check_restart_request

    world = check_nodes(run_config, plan)
    check_async_request(run_config, world > 1 or under_torchrun())
    return CheckedRun(world, check_restart_request(run_config, world))


def auto_device_name(auto: AutoRequest, plan: Plan, run_config: RunConfig, device_explicit: bool) -> str:
    """The device `--plan auto` / `--batch-size auto` choose for (the one this run will use),
    after what the search needs from the run: a chat run's template, checked before seconds of
    search, and the sequences the data holds (`auto.rows`) and the job's nodes."""
    from trainwise.api.auto_choice import data_rows
    from trainwise.engine.data.chat import chat_tokenizer
    from trainwise.engine.job import device_name_for_estimate
    from trainwise.engine.runtime import runtime_device

    if run_config.chat:
        chat_tokenizer(run_config.tokenizer)
    if auto.plan:
        auto.nnodes = run_config.nnodes
        auto.rows = data_rows(run_config, plan.seq_len)
    return device_name_for_estimate(runtime_device(plan.device, explicit=device_explicit))


def check_before_launch(model: str, plan: Plan, run_config: RunConfig, world: int, device_explicit: bool, *,
                        task: str | None, trust_remote_code: bool) -> None:
    """What can fail before torchrun starts a worker, checked once here (bad input: exit 2):
    the request on this device, the model's layout, the --out its ranks write (under --nnodes
    every node checks it, for the whole job of `world` processes: storage shared by the nodes)."""
    from trainwise.api.training import check_train_request
    from trainwise.engine.output_preflight import check_training_output, count_parameters_of
    from trainwise.engine.runtime import runtime_device
    from trainwise.models import resolve_model
    from trainwise.models.families.checks import check_model_layout
    from trainwise.plan.layout import resolve_layout

    layout = resolve_layout(plan, world)
    spec = resolve_model(model, task=task, trust_remote_code=trust_remote_code)
    check_train_request(plan, runtime_device(plan.device, explicit=device_explicit), spec, world)
    check_model_layout(spec.config, plan, layout)
    check_training_output(run_config.output, plan, run_config, count_parameters_of(spec))
