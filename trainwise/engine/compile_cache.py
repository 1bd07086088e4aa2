"""Where torch.compile keeps its cache, and how to tell that a step compiled.

Inductor's FX graph cache and the AOTAutograd cache store each compiled graph (forward and
backward) on disk, keyed by the graph, its inputs' shapes and the torch version, so a later
run of the same blocks loads the compiled code instead of generating and building it. The
cache goes under the per-user trainwise cache ($TRAINWISE_CACHE, else
$XDG_CACHE_HOME/trainwise, else ~/.cache/trainwise) in compile/, where a user can see and
delete it, unless TORCHINDUCTOR_CACHE_DIR already names a place (then that one is used)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainwise.hardware.profile import default_profile_dir

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def default_compile_cache_dir() -> Path:
    """compile/ beside the device profiles in the per-user trainwise cache."""
    return default_profile_dir().parent / "compile"


def enable_compile_cache() -> Path:
    """Turn on the FX graph and AOTAutograd caches and return their directory (created).
    Called before the first compile of the process."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Importing inductor sets the variable to its own default (a temporary directory):
    # that value is not a user's choice, any other value is.
    chosen = os.environ.get(CACHE_ENV)
    user_chose = chosen is not None and os.path.abspath(chosen) != os.path.abspath(default_cache_dir())
    directory = Path(chosen) if user_chose else default_compile_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(directory.resolve())  # inductor reads it at each cache access

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return directory


def compile_events() -> int:
    """How many timed compiler events (Dynamo tracing, graph compiles, cache loads) this
    process has recorded: a step during which it grew compiled something. Zero while
    Dynamo was never imported, so eager runs pay nothing to ask."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import compilation_time_metrics

    return sum(len(times) for times in compilation_time_metrics.values())


def compile_cache_dir() -> str | None:
    """The directory inductor caches compiled graphs in for this process, once known."""
    return os.environ.get(CACHE_ENV)
