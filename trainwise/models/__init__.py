"""Models: the architecture catalog, model resolution, building and example batches.

    spec = resolve_model("bert-large-uncased")          # or a directory, or pkg.mod:fn
    model = build_model(spec, device="meta")            # no memory, no weights
    batch = example_batch(spec, batch_size=4, seq_len=512)

The names below are imported on first use, so reading the catalog (models/catalog.py)
imports neither torch nor transformers.
"""

from trainwise.common.lazy import lazy_attributes

_LAZY = {
    "TASKS": ("trainwise.models.tasks", "TASKS"),
    "FUNCTION_TASK": ("trainwise.models.tasks", "FUNCTION_TASK"),
    "ModelSpec": ("trainwise.models.spec", "ModelSpec"),
    "resolve_model": ("trainwise.models.resolve", "resolve_model"),
    "resolve_model_object": ("trainwise.models.resolve", "resolve_model_object"),
    "build_model": ("trainwise.models.build", "build_model"),
    "build_model_with_notes": ("trainwise.models.build", "build_model_with_notes"),
    "BuiltModel": ("trainwise.models.build", "BuiltModel"),
    "count_parameters": ("trainwise.models.build", "count_parameters"),
    "example_batch": ("trainwise.models.batch", "example_batch"),
    "check_seq_len": ("trainwise.models.positions", "check_seq_len"),
    "catalog_entries": ("trainwise.models.listing", "catalog_entries"),
    "catalog_parameter_count": ("trainwise.models.listing", "catalog_parameter_count"),
    "CatalogEntry": ("trainwise.models.listing", "CatalogEntry"),
}

__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = list(_LAZY)
