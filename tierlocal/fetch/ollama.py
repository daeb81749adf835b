"""`tierlocal pull ollama://TAG`: pull through a running Ollama server with the ``ollama``
client (``OLLAMA_HOST``, parsed the client's way: ``http://host`` without a port is port 80).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import ollama

from ..catalog import load_models
from ..errors import SourceError, TierlocalError

__all__ = ["OllamaPull", "OllamaProgress", "pull_ollama", "close_catalog_tags"]


@dataclass(frozen=True)
class OllamaProgress:
    """Bytes done and in all over the layers Ollama has announced so far."""

    status: str
    completed_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class OllamaPull:
    """A pulled model as the server lists it: tag, manifest digest, size (bytes)."""

    tag: str
    digest: str
    size: int
    host: str

    def to_json(self) -> dict[str, object]:
        """The documented ``pull ollama://TAG --json`` object."""
        return {"source": f"ollama://{self.tag}", "host": self.host, "model": self.tag, "digest": self.digest, "bytes": self.size, "files": []}


def close_catalog_tags(tag: str, limit: int = 3) -> list[str]:
    """Ollama tags from recipes/models.toml that look like ``tag``."""
    tags = sorted({entry.ollama for entry in load_models() if entry.ollama})
    return difflib.get_close_matches(tag, tags, n=limit, cutoff=0.5)


def _not_found(tag: str) -> SourceError:
    matches = close_catalog_tags(tag.rsplit("/", 1)[-1])
    hint = (
        f"close matches in the catalog: {', '.join(matches)}"
        if matches
        else "check the name on ollama.com/library, or `tierlocal check` for a recommendation"
    )
    return SourceError(f"ollama://{tag}", f'model "{tag}" not found', hint=hint)


def pull_ollama(tag: str, *, insecure: bool = False, host: str | None = None, progress: Callable[[OllamaProgress], None] | None = None) -> OllamaPull:
    """Pull ``tag`` into the Ollama server at ``host`` (default ``OLLAMA_HOST``), reporting
    progress as the server streams it.

    Raises:
        SourceError: no server there, the tag does not exist, or the registry refused.
    """
    client = ollama.Client(host=host)
    base_url = str(client._client.base_url).rstrip("/")
    layers: dict[str, tuple[int, int]] = {}
    try:
        try:
            for update in client.pull(tag, insecure=insecure, stream=True):
                if update.digest and update.total:
                    layers[update.digest] = (update.completed or 0, update.total)
                if progress is not None:
                    progress(
                        OllamaProgress(update.status or "", sum(done for done, _ in layers.values()), sum(total for _, total in layers.values()))
                    )
            listed = {model.model: model for model in client.list().models}
        except (ConnectionError, httpx.ConnectError):
            raise SourceError(
                f"ollama://{tag}",
                f"no Ollama server answers at {base_url}",
                hint="start one with `ollama serve`, or set OLLAMA_HOST to where it runs",
            ) from None
        except ollama.ResponseError as exc:
            message = str(exc.error)
            if exc.status_code == 404 or "file does not exist" in message or "not found" in message:
                raise _not_found(tag) from None
            raise SourceError(
                f"ollama://{tag}", f"Ollama refused the pull: {message}", hint="check the tag, the registry, and --insecure for a plain-HTTP registry"
            ) from None
    finally:
        client._client.close()
    model = listed.get(tag) or listed.get(tag if ":" in tag else f"{tag}:latest")
    if model is None:
        raise TierlocalError(f"ollama://{tag}: the pull finished but the server does not list the model", hint="run `ollama list` to see what it has")
    return OllamaPull(tag, model.digest or "", int(model.size or 0), base_url)
