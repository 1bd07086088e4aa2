"""A Hugging Face Hub id that is not in the catalog: its config.json, and nothing else.

An estimate needs only the architecture, so only `config.json` is read: from the local
Hugging Face cache first (`HF_HUB_CACHE`, laid out as the Hub client writes it), else
fetched through `huggingface_hub` unless `HF_HUB_OFFLINE=1`. Weights are never
downloaded here; a model built from a Hub config starts from random weights, and says so."""

from __future__ import annotations

import os
import re
from pathlib import Path

from trainwise.common.errors import InputError

# owner/name as the Hub spells ids: letters, digits, '-', '_', '.'; no leading dot or dash.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
CONFIG_FILE = "config.json"


def looks_like_hub_id(name: str) -> bool:
    """True for `owner/name` (a path that exists on disk is read as a directory before this)."""
    return bool(HUB_ID.match(name)) and ".." not in name and not name.endswith(".git")


def cached_model_ids() -> list[str]:
    """The Hub repositories in the local Hugging Face cache ("org/name"), as the Hub client
    lays it out (models--org--name folders); read without touching the network."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    if not root.is_dir():
        return []
    return sorted(p.name.removeprefix("models--").replace("--", "/") for p in root.glob("models--*") if p.is_dir())


def did_you_mean(name: str) -> str:
    """"did you mean X? " for the catalog name, Hub id or cached repository closest to
    `name`, or "" when none is close."""
    from trainwise.common.suggest import closest
    from trainwise.models.catalog import catalog_records

    known = [*(n for r in catalog_records() for n in (r.name, r.hf_name) if n), *cached_model_ids()]
    guess = closest(name, known)
    return f"did you mean {guess}? " if guess else ""


def hub_config_folder(repo_id: str, revision: str | None = None) -> Path:
    """The folder holding `repo_id`'s config.json in the local cache, fetching that one file
    when it is not cached and the Hub may be reached. InputError naming the cache otherwise."""
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    cache = constants.HF_HUB_CACHE
    cached = try_to_load_from_cache(repo_id, CONFIG_FILE, cache_dir=cache, revision=revision)
    if isinstance(cached, str):
        return Path(cached).parent
    if constants.HF_HUB_OFFLINE or _offline_now():
        raise InputError("MODEL", f"'{repo_id}' is not in the catalog and its {CONFIG_FILE} is not in the Hugging Face "
                                  f"cache ({cache}); {did_you_mean(repo_id)}HF_HUB_OFFLINE=1 forbids fetching it: unset HF_HUB_OFFLINE, fetch it "
                                  f"once with `hf download {repo_id} {CONFIG_FILE}`, or pass a local model directory")
    try:
        path = hf_hub_download(repo_id, CONFIG_FILE, revision=revision, cache_dir=cache)
    except (RepositoryNotFoundError, GatedRepoError) as error:
        kind = "is gated: log in with `hf auth login` and accept its terms" if isinstance(error, GatedRepoError) \
            else "is not a Hub repository you can read (check the spelling, or log in for a private one)"
        raise InputError("MODEL", f"'{repo_id}' {kind}; `trainwise models` lists the catalog") from None
    except (EntryNotFoundError, RevisionNotFoundError):
        raise InputError("MODEL", f"'{repo_id}' has no {CONFIG_FILE} on the Hub: not a transformers model") from None
    except (LocalEntryNotFoundError, OSError) as error:  # no network, DNS, proxy, timeouts
        raise InputError("MODEL", f"'{repo_id}' is not in the catalog or the Hugging Face cache ({cache}), and the Hub "
                                  f"could not be reached ({_first_line(error)}); {did_you_mean(repo_id)}pass a local model directory, or fetch "
                                  f"{CONFIG_FILE} once where the Hub can be reached") from None
    return Path(path).parent


def _offline_now() -> bool:
    """HF_HUB_OFFLINE as set now (the Hub client reads it once, when first imported)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else type(error).__name__
