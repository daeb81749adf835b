"""The GGUF an Ollama tag names in Ollama's local store (``$OLLAMA_MODELS``, else
``~/.ollama/models``), read from its manifest without the Ollama server or client."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import constants
from ..errors import UsageError

__all__ = ["ollama_store_blob"]

#: The manifest layer that holds a model's GGUF.
_MODEL_LAYER = "application/vnd.ollama.image.model"
#: Longest manifest read, in bytes.
_MAX_MANIFEST_BYTES = 1 << 20


def ollama_store_blob(tag: str) -> Path:
    """The GGUF an Ollama tag names in the local store ($OLLAMA_MODELS): its manifest
    (manifests/HOST/NAMESPACE/NAME/TAG, defaults registry.ollama.ai, library, latest) lists the
    model layer, whose blob is blobs/sha256-DIGEST.

    Raises:
        UsageError: the tag is malformed or not in the store.
    """
    name, _, version = tag.partition(":")
    parts = name.split("/")
    if (
        not name
        or len(parts) > 3
        or any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", part) for part in parts)
        or (version and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", version))
    ):
        raise UsageError(f"ollama://{tag} is not an Ollama tag", hint="e.g. ollama://gemma3:270m or ollama://OWNER/NAME:TAG")
    if len(parts) == 1:
        parts = ["registry.ollama.ai", "library", *parts]
    elif len(parts) == 2:
        parts = ["registry.ollama.ai", *parts]
    store = constants.ollama_models_dir()
    manifest = store.joinpath("manifests", *parts, version or "latest")
    try:
        with manifest.open("rb") as handle:
            layers = json.loads(handle.read(_MAX_MANIFEST_BYTES)).get("layers", [])
    except (OSError, ValueError, AttributeError):
        raise UsageError(
            f"ollama://{tag} is not in Ollama's store ({manifest} is missing or unreadable)", hint=f"pull it first: tierlocal pull ollama://{tag}"
        ) from None
    digest = next((layer.get("digest") for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == _MODEL_LAYER), None)
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UsageError(f"ollama://{tag}: its manifest has no model layer", hint="is it a model (not an embedding adapter or template only)?")
    blob = store / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise UsageError(f"ollama://{tag}: its model blob {blob} is missing", hint=f"pull it again: tierlocal pull ollama://{tag}")
    return blob
