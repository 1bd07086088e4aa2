"""The catalog: architecture configs (no weights) shipped as ``catalog/<name>.json``.

Each file holds the Hugging Face ``config.json`` fields that decide the architecture
(sizes, vocabulary, positions, rope and MoE settings) plus a ``"trainwise"`` section:
``name``, usual ``task``, ``hf_name`` (Hub id), ``tiny`` (a small test model) and
optional ``aliases`` (other Hub ids for the same model).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from trainwise.common.errors import InputError


@dataclass(frozen=True)
class CatalogRecord:
    """One catalog file: its trainwise section and the Hugging Face config fields."""

    name: str
    task: str
    hf_name: str | None
    tiny: bool
    aliases: tuple[str, ...]
    hf_config: dict[str, Any]


@lru_cache(maxsize=1)
def catalog_records() -> tuple[CatalogRecord, ...]:
    """Every catalog file, large models first by name, tiny test models last."""
    records = []
    for path in resources.files("trainwise.models").joinpath("catalog").iterdir():
        if path.name.endswith(".json"):
            records.append(_read_record(json.loads(path.read_text(encoding="utf-8"))))
    return tuple(sorted(records, key=lambda record: (record.tiny, record.name.lower())))


def _read_record(data: dict[str, Any]) -> CatalogRecord:
    section = data.pop("trainwise")
    return CatalogRecord(
        name=section["name"],
        task=section["task"],
        hf_name=section.get("hf_name"),
        tiny=bool(section.get("tiny", False)),
        aliases=tuple(section.get("aliases", ())),
        hf_config=data,
    )


def catalog_names() -> list[str]:
    """Catalog names as spelled in the catalog."""
    return [record.name for record in catalog_records()]


@lru_cache(maxsize=1)
def _lookup_table() -> dict[str, CatalogRecord]:
    table = {}
    for record in catalog_records():
        for key in (record.name, record.hf_name, *record.aliases):
            if key:
                table[key.lower()] = record
    return table


def find_record(name: str) -> CatalogRecord | None:
    """The catalog record for a name or Hub id, ignoring case; None when absent."""
    return _lookup_table().get(name.strip().lower())


def is_model_directory(name: str) -> bool:
    """Whether MODEL names a local Hugging Face model directory (a folder with config.json),
    which comes before a catalog name of the same spelling (models/resolve.py)."""
    path = Path(name).expanduser()
    return path.is_dir() and (path / "config.json").is_file()


def catalog_record_for(name: str) -> CatalogRecord | None:
    """The catalog record `resolve_model(name)` resolves to, found without transformers; None
    when MODEL is a directory or not in the catalog."""
    return None if is_model_directory(name) else find_record(name)


def closest_names(name: str, count: int = 3) -> list[str]:
    """The `count` catalog names most like `name` (difflib similarity, ignoring case)."""
    wanted = name.strip().lower().rsplit("/", 1)[-1]
    names = catalog_names()
    by_lower = {candidate.lower(): candidate for candidate in names}
    close = difflib.get_close_matches(wanted, list(by_lower), n=count, cutoff=0.0)
    return [by_lower[match] for match in close]


def unknown_model_error(name: str) -> InputError:
    """The one-line error for a name that is not in the catalog."""
    from trainwise.common.suggest import closest
    from trainwise.models.hub_config import cached_model_ids

    suggestions = ", ".join(closest_names(name))
    cached = closest(name, cached_model_ids())
    in_cache = f"; in the local Hugging Face cache: {cached}" if cached else ""
    return InputError("MODEL", f"unknown model '{name}'; closest catalog names: {suggestions}{in_cache} "
                               "(see `trainwise models`)")
