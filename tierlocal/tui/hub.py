"""The Hub screen: `tierlocal search` in the terminal UI — words typed, the GGUF repositories on
the Hub that match, each planned for the machine the What-fits screen plans for, at its
best-fitting quantisation, with the base model whose score it inherits."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from ..errors import TierlocalError
from ..hub_recommendation import SearchRecommendation, SearchResult, search_hub
from .plan_panel import STATUS_STYLES
from .planning import Planning

__all__ = ["HubScreen", "hub_cells"]

#: The table's columns and their widths (cells; None: as wide as the widest value).
_COLUMNS = {"repo": 34, "base": 16, "quant": 10, "fit": 8, "needs": 9, "tok/s": 7, "score": 6, "downloads": None}


def hub_cells(result: SearchResult, best: SearchResult | None) -> list[str | Text]:
    """One found repository as the table shows it (``†``: a score inherited from the catalog)."""
    cells, candidate = result.cells(), result.candidate
    status = "-" if candidate is None else "best" if result is best else candidate.status
    fit = Text(status, style=STATUS_STYLES.get(status, ""))
    return [cells["repo"], cells["base"], cells["quant"], fit, cells["needs"], cells["tok/s"], cells["score"], cells["downloads"]]


class HubScreen(Screen[None]):
    """Repositories on the Hub, planned for this machine."""

    def __init__(self, planning: Planning) -> None:
        super().__init__()
        self.planning = planning
        self.found: SearchRecommendation | None = None

    def compose(self) -> ComposeResult:
        yield Input(placeholder="search the Hub for GGUF repositories: words, then Enter", id="hub-words")
        yield Static(
            "Repositories are planned for the machine What fits (1) plans for; † a score from the catalog model the card names.", id="hub-status"
        )
        yield DataTable(id="hub-table", cursor_type="row", zebra_stripes=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name, width in _COLUMNS.items():
            table.add_column(name, width=width)
        self.query_one(Input).focus()

    @on(Input.Submitted, "#hub-words")
    def _submitted(self, event: Input.Submitted) -> None:
        words = event.value.strip()
        if words:
            self.say(f"searching the Hub for {words!r}…")
            self._search(words, self.planning)

    @work(thread=True, exclusive=True, group="hub")
    def _search(self, words: str, planning: Planning) -> None:
        """Search and plan off the UI thread (the hub's answers, the headers, the estimator)."""
        try:
            found = search_hub(
                words, planning.hardware, ctx=planning.ctx, parallel=1, min_tokens_per_s=planning.min_tokens_per_s, ctx_up_to_training=True
            )
        except TierlocalError as exc:
            self.app.call_from_thread(self.say, f"{exc}" + (f" — {exc.hint}" if exc.hint else ""), "error")
            return
        self.app.call_from_thread(self._show, words, found)

    def _show(self, words: str, found: SearchRecommendation) -> None:
        self.found = found
        table = self.query_one(DataTable)
        table.clear()
        best = found.best
        for result in found.results:
            table.add_row(*hub_cells(result, best), key=result.found.listing.repo_id)
        skipped = "; ".join(f"{s.repo_id}: {s.why}" for s in found.skipped)
        pick = f"best here: {best.found.listing.repo_id} {best.candidate.entry.quant}" if best and best.candidate else "nothing fits here"
        self.say(f"{len(found.results)} repositories match {words!r}; {pick}" + (f". Skipped {skipped}" if skipped else ""))
        table.focus()

    def say(self, message: str, severity: str = "information") -> None:
        """Show ``message`` on the status line (plain text: names may hold brackets)."""
        style = {"error": "bold red", "warning": "yellow"}.get(severity, "green")
        self.query_one("#hub-status", Static).update(Text(message, style=style))
