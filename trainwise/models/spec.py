"""ModelSpec: everything trainwise knows about a model before building it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:  # an annotation only: reading a depth or a spec needs no transformers import
    from transformers import PretrainedConfig

Source = Literal["catalog", "directory", "hub", "object", "function"]


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: where it came from, its task and its architecture config.

    name            what the user typed, or the catalog's spelling for catalog models
    source          "catalog", "directory" (a local Hugging Face model folder), "hub" (a
                    Hub id's config.json only, weights at random), "object" (a
                    transformers model the caller built and passed in) or "function"
                    (``package.module:function`` returning (model, batch))
    task            one of TASKS, or "custom" for model functions
    family          the config's ``model_type`` ("llama", "bert", ...); None for functions
    config          the ``transformers`` config, already prepared for `task`; None for functions
    max_positions   longest usable sequence in tokens (an image classifier: its patches,
                    which it always sees); None when unbounded (relative
                    positions, as in T5) or unknown (functions)
    vocab_size      token ids are in [0, vocab_size); None for functions
    hf_name         the Hugging Face Hub id, when known
    allowed_tasks   the tasks ``--task`` may choose for this model
    tiny            True for the catalog's small test models
    trust_remote_code  whether the config's own Python code may run (directories only)
    function        the model function, for source == "function"
    """

    name: str
    source: Source
    task: str
    family: str | None
    config: PretrainedConfig | None = field(compare=False, repr=False)
    max_positions: int | None
    vocab_size: int | None
    hf_name: str | None = None
    allowed_tasks: tuple[str, ...] = ()
    tiny: bool = False
    trust_remote_code: bool = False
    function: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
