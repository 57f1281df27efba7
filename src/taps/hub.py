"""Hugging Face hub ids: what looks like one, downloads, and the offline rule (fail at once,
naming the repository, when the hub cannot be reached and the cache lacks it)."""

from __future__ import annotations

import os
import re

PATH_PREFIXES = ("/", "./", "../", "~")


class AssetError(RuntimeError):
    """A model or file could not be fetched, found or loaded; the message says what to do."""


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(text: str) -> bool:
    """Whether `text` has the form of a Hugging Face hub id (owner/name)."""
    return bool(_HUB_ID.fullmatch(text)) and not text.startswith(PATH_PREFIXES)


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_snapshot(repo_id: str) -> str:
    """The local folder of a hub repository: downloaded (or found in the Hugging Face cache when
    offline). Clear errors for a missing repository or an offline machine without a copy."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, local_files_only=hub_offline())
    except LocalEntryNotFoundError:
        raise AssetError(f"{repo_id} is not in the Hugging Face cache and the hub cannot be reached "
                         "(offline); download it where the hub is reachable, or pass a local folder") from None
    except (HfHubHTTPError, OSError) as error:
        raise AssetError(f"could not download {repo_id} from the Hugging Face hub: {error}") from None




def check_cached_offline(repo_id: str) -> None:
    """Offline, a hub model must already be in the Hugging Face cache: say so at once, not after
    retries."""
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            raise AssetError(f"{repo_id} is not in the Hugging Face cache and the hub cannot be reached "
                             "(offline); download it where the hub is reachable, or pass a local folder")
