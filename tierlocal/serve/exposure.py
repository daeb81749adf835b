"""Who can reach a server: loopback addresses, and the rule that anything else needs a key.
llama-server and llama-cpp-python take one (by file or environment, never on a command line);
Ollama has none, so it is only ever bound to loopback."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from .. import constants
from ..errors import UsageError

__all__ = ["is_loopback", "check_exposure", "check_ollama_exposure"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key_file: Path | None) -> Path | None:
    """The key file to pass, or None on loopback. Any other address needs a key, from
    ``--api-key-file`` (mode 0600 or stricter) or systemd's credential ``api-key``.

    Raises:
        UsageError: no key for a non-loopback address, or a key file that is unreadable,
            readable by others, or empty.
    """
    if api_key_file is None and (credentials := constants.credentials_dir()) is not None:
        candidate = credentials / "api-key"
        api_key_file = candidate if candidate.is_file() else None
    if api_key_file is None:
        if is_loopback(host):
            return None
        raise UsageError(
            f"refusing to bind {host} without an API key: anyone who can reach it could use the model",
            hint="pass --api-key-file FILE (one key per line, mode 0600), or a systemd credential named api-key; or bind 127.0.0.1",
        )
    try:
        mode = api_key_file.stat().st_mode
    except OSError:
        raise UsageError(f"--api-key-file {api_key_file}: cannot read it", hint="create it with one key per line, chmod 600") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and constants.credentials_dir() is None:
        raise UsageError(f"--api-key-file {api_key_file} is readable by others (mode {stat.S_IMODE(mode):o})", hint=f"chmod 600 {api_key_file}")
    if not api_key_file.read_text().strip():
        raise UsageError(f"--api-key-file {api_key_file} is empty", hint="write one key per line")
    return api_key_file


def check_ollama_exposure(host: str) -> None:
    """Ollama has no authentication: it is only ever bound to loopback.

    Raises:
        UsageError: ``host`` is not a loopback address.
    """
    if not is_loopback(host):
        raise UsageError(
            f"refusing to expose Ollama on {host}: Ollama has no API keys",
            hint="bind 127.0.0.1 and put `tierlocal gateway` (or a reverse proxy with auth) in front",
        )
