"""The catalog as a table: what `trainwise models` lists."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainwise.models.build import build_model, count_parameters
from trainwise.models.catalog import catalog_records
from trainwise.models.resolve import resolve_model


@dataclass(frozen=True)
class CatalogEntry:
    """One catalog model with its usual task.

    params          parameter count with the usual task's head, tied weights once
                    (computed by building the model on the meta device)
    max_positions   longest usable sequence in tokens; None when unbounded
    """

    name: str
    family: str
    task: str
    params: int
    hf_name: str | None
    tiny: bool
    max_positions: int | None


def catalog_entries() -> list[CatalogEntry]:
    """Every catalog model: by family, smallest first, then the tiny test models."""
    entries = [_entry(record.name) for record in catalog_records()]
    return sorted(entries, key=lambda entry: (entry.tiny, entry.family, entry.params))


@lru_cache(maxsize=None)
def catalog_parameter_count(name: str, task: str | None = None) -> int:
    """Parameters of catalog model `name` built for `task` (default: its usual task)."""
    return count_parameters(build_model(resolve_model(name, task), device="meta"))


def _entry(name: str) -> CatalogEntry:
    spec = resolve_model(name)
    return CatalogEntry(
        name=spec.name,
        family=spec.family,
        task=spec.task,
        params=catalog_parameter_count(spec.name),
        hf_name=spec.hf_name,
        tiny=spec.tiny,
        max_positions=spec.max_positions,
    )
