"""`tierlocal serve`: plan a model for this machine, run an engine with exactly that plan, wait
until it answers, check the load against the plan, and supervise it until stopped.

Every engine — :mod:`.llama` (llama-server), :mod:`.ollama` (Ollama), :mod:`.python`
(llama-cpp-python's server) — has the same entry, ``serve_ENGINE(options, say=…, on_ready=…)
-> exit code``; :func:`serve` picks one. :mod:`.run` holds the steps they share (plan, launch,
verify, supervise), :mod:`tierlocal.engines.process` the child process, :mod:`.state` the file ``tierlocal
status`` reads, :mod:`.history` the loads later plans learn from, :mod:`.exposure` who may reach
a server, :mod:`.template` the chat template, :mod:`.probe` the first answer before "ready",
:mod:`.systemd` units and readiness notifications.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run import OnReady, Say, ServeOptions

__all__ = ["serve", "ENGINES"]

#: The engines ``--engine`` names.
ENGINES = ("llama-server", "ollama", "python")


def serve(options: ServeOptions, *, say: Say, on_ready: OnReady) -> int:
    """Run ``options.engine`` for ``options`` until SIGTERM/SIGINT; returns the exit code.
    Each engine module is imported only when it runs (Ollama's client is a slow import).

    Raises:
        UsageError: llama-server options (after ``--``) for another engine; the port is taken.
    """
    if options.engine_args and options.engine != "llama-server":
        from ..errors import UsageError

        raise UsageError(
            f"options after -- ({' '.join(options.engine_args)}) go to llama-server only", hint="drop them, or use --engine llama-server"
        )
    if options.role in ("embeddings", "rerank") and options.engine != "llama-server":
        from ..errors import UsageError

        raise UsageError(f"--role {options.role} is served by llama-server only", hint="drop --engine, or serve it with --engine llama-server")
    from .port import check_port_free

    check_port_free(options.host, options.port, other_listener_ok=options.engine == "ollama")  # before any file of the port is touched
    if options.engine == "ollama":
        from .ollama import serve_ollama

        return serve_ollama(options, say=say, on_ready=on_ready)
    if options.engine == "python":
        from .python import serve_python

        return serve_python(options, say=say, on_ready=on_ready)
    from .llama import serve_llama

    return serve_llama(options, say=say, on_ready=on_ready)
