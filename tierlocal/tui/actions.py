"""What the What-fits screen's pull and serve keys do with the selected entry.

Pull downloads the entry's GGUF from its Hugging Face repo as ``tierlocal pull NAME`` does
(resumable, verified, into the hub cache) in a worker thread, with a progress bar. Serve starts
``tierlocal serve FILE`` on the downloaded file, in the background and in a session of its own
(it keeps serving after the UI quits; ``tierlocal status`` shows it, and Live once its load is
checked), at the context and slots the table plans, on the first free port from 8080."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import constants
from ..errors import TierlocalError
from ..fetch.hf import cached_gguf, check_disk, parse_hf_pull, plan_hf_pull, run_pull
from ..serve.state import running_servers, starting_servers
from ..units import format_bytes
from .rows import FitsRow

if TYPE_CHECKING:
    from .fits import FitsScreen

__all__ = ["pull_selection", "serve_selection", "serve_argv", "free_serve_port"]

#: Ports tried for a new serve, from llama-server's default up.
PORTS_TRIED = 32


def pull_selection(screen: FitsScreen, row: FitsRow) -> None:
    """Download ``row``'s file with a progress bar under the table (one pull at a time)."""
    entry = row.candidate.entry
    if not entry.gguf_repo:
        screen.say(f"{entry.family} has no GGUF repo in the catalog to pull from", "warning")
        return
    bar = screen.query_one("#fits-progress")

    def work() -> None:
        try:
            spec = parse_hf_pull(f"hf://{entry.gguf_repo}")
            plan = plan_hf_pull(spec, quant=entry.quant, dest_dir=None)
            check_disk(plan, constants.DEFAULT_KEEP_FREE_BYTES)
            screen.app.call_from_thread(_progress_start, screen, plan.remaining_bytes, plan.total_bytes - plan.remaining_bytes)
            files = run_pull(plan, progress=lambda n: screen.app.call_from_thread(bar.advance, n))  # type: ignore[attr-defined]
        except TierlocalError as exc:
            screen.app.call_from_thread(_progress_done, screen, f"pull {entry.family} {entry.quant}: {exc}", "error")
            return
        where = files[0].path if files else "the hub cache"
        screen.app.call_from_thread(
            _progress_done, screen, f"pulled {entry.family} {entry.quant} into {where} ({format_bytes(plan.total_bytes)}, verified)", "information"
        )

    screen.say(f"pulling {entry.family} {entry.quant} from hf://{entry.gguf_repo} …")
    screen.run_worker(work, thread=True, exclusive=True, group="pull", name="pull")


def _progress_start(screen: FitsScreen, remaining: int, present: int) -> None:
    from textual.widgets import ProgressBar

    bar = screen.query_one("#fits-progress", ProgressBar)
    bar.update(total=max(remaining + present, 1), progress=present)
    bar.display = True


def _progress_done(screen: FitsScreen, message: str, severity: str) -> None:
    screen.query_one("#fits-progress").display = False
    screen.say(message, severity)


def free_serve_port() -> int | None:
    """The first port from llama-server's default that no tierlocal serve holds and that
    binds on loopback now (None: none of :data:`PORTS_TRIED`)."""
    taken = {server.url for server in running_servers()} | {str(server.get("url", "")) for server in starting_servers()}
    for port in range(constants.LLAMA_SERVER_PORT, constants.LLAMA_SERVER_PORT + PORTS_TRIED):
        if any(str(url).endswith(f":{port}") for url in taken):
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return None


def serve_argv(model: Path, *, ctx_per_slot: int, parallel: int, port: int) -> list[str]:
    """``tierlocal serve`` for ``model`` as the table planned it (``--ctx`` is per slot, as everywhere)."""
    return [sys.executable, "-m", "tierlocal", "serve", str(model), "--ctx", str(ctx_per_slot), "--parallel", str(parallel), "--port", str(port)]


def serve_selection(screen: FitsScreen, row: FitsRow) -> None:
    """Start ``tierlocal serve`` on ``row``'s downloaded file, in the background."""
    entry = row.candidate.entry
    planning = screen.planning
    if planning.hardware.overridden or planning.hardware.ram_overridden:
        screen.say(f"the table plans {planning.machine_label}, and serve runs here: press m and leave both blank first", "warning")
        return
    if not row.fits:
        screen.say(f"{entry.family} {entry.quant} does not fit here: {row.reason}", "warning")
        return
    model = cached_gguf(parse_hf_pull(f"hf://{entry.gguf_repo}"), quant=entry.quant) if entry.gguf_repo else None
    if model is None:
        screen.say(f"{entry.family} {entry.quant} is not downloaded yet: press d to pull it", "warning")
        return
    port = free_serve_port()
    if port is None:
        screen.say(f"no free port from {constants.LLAMA_SERVER_PORT} to {constants.LLAMA_SERVER_PORT + PORTS_TRIED - 1}", "error")
        return
    log = constants.run_dir() / f"ui-serve-{port}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = serve_argv(model, ctx_per_slot=planning.ctx, parallel=planning.parallel, port=port)
    with log.open("ab") as output:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    screen.say(
        f"tierlocal serve {entry.family} {entry.quant} on port {port} started (pid {process.pid}, log {log}); Live (2) shows it once its load is "
        "checked"
    )
