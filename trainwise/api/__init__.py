"""The public Python API: `trainwise.api.estimate(...)`, `trainwise.api.train(...)`.

Imported on first use, as `trainwise` itself is: the command line imports api/ modules for
the checks it makes before torch is imported (a typo answered in a fraction of a second,
not after seconds of imports), and `train` pulls in the engine, which `estimate` never needs."""

import sys
import types

from trainwise.common.lazy import lazy_attributes

_LAZY = {
    "estimate": ("trainwise.api.estimate", "estimate"),
    "EstimateResult": ("trainwise.api.estimate", "EstimateResult"),
    "train": ("trainwise.api.training", "train"),
    "TrainResult": ("trainwise.api.training", "TrainResult"),
    "RunConfig": ("trainwise.engine.run_config", "RunConfig"),
}


__getattr__ = lazy_attributes(__name__, _LAZY)


class _Api(types.ModuleType):
    """`trainwise.api.estimate` is the function, also once its module of the same name is
    loaded: the import system sets a package's attribute to each submodule it loads, which
    would leave `from trainwise.api import estimate` handing out the module."""

    def __setattr__(self, name, value):
        if name == "estimate" and isinstance(value, types.ModuleType):
            value = value.estimate
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Api

__all__ = list(_LAZY)
