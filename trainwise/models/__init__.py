"""Models: the architecture catalog, model resolution, building and example batches.

    spec = resolve_model("bert-large-uncased")          # or a directory, or pkg.mod:fn
    model = build_model(spec, device="meta")            # no memory, no weights
    batch = example_batch(spec, batch_size=4, seq_len=512)
"""

from trainwise.models.batch import example_batch
from trainwise.models.build import BuiltModel, build_model, build_model_with_notes, count_parameters
from trainwise.models.listing import CatalogEntry, catalog_entries, catalog_parameter_count
from trainwise.models.positions import check_seq_len
from trainwise.models.resolve import resolve_model, resolve_model_object
from trainwise.models.spec import ModelSpec
from trainwise.models.tasks import FUNCTION_TASK, TASKS

__all__ = [
    "TASKS",
    "FUNCTION_TASK",
    "ModelSpec",
    "resolve_model",
    "resolve_model_object",
    "build_model",
    "build_model_with_notes",
    "BuiltModel",
    "count_parameters",
    "example_batch",
    "check_seq_len",
    "catalog_entries",
    "catalog_parameter_count",
    "CatalogEntry",
]
