"""The What-fits screen: the catalog planned for this machine (or the one ``--gpu``/``--ram``
describe) as a table that filters and sorts, the selected entry's plan beside it, and keys that
replan (context, slots, quantisation, machine), pull the selection and serve it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, ProgressBar, Static

from ..errors import TierlocalError
from ..hardware.types import Hardware
from ..plan.candidates import CatalogRecommendation
from ..units import format_bytes
from .machine_dialog import MachineDialog
from .plan_panel import STATUS_STYLES, plan_renderable
from .planning import Planning, plan_catalog
from .rows import FIT_FILTERS, SORTS, FitsRow, next_quant, rows_of, visible_rows

__all__ = ["FitsScreen", "MAX_CTX", "MAX_PARALLEL"]

#: The context and slot limits the replan keys stop at (tokens; slots).
MIN_CTX, MAX_CTX = 512, 1 << 20
MAX_PARALLEL = 64
#: The table's columns and their widths (cells; None: as wide as the widest value).
_COLUMNS = {"model": 18, "quant": 9, "fit": 8, "score": 5, "tok/s": 7, "size": 9, "ctx": 4, "licence": None}


class FitsScreen(Screen[None]):
    """What fits, and the plan of the selected entry."""

    BINDINGS = [  # noqa: RUF012 (Textual's own class attribute)
        Binding("slash", "filter", "filter"),
        Binding("f", "cycle_fit", "fits/tight/no room"),
        Binding("o", "cycle_sort", "sort"),
        Binding("r", "reverse", "reverse", show=False),
        Binding("plus,equals_sign", "ctx(2)", "ctx ×2"),
        Binding("minus", "ctx(0.5)", "ctx ÷2"),
        Binding("right_square_bracket", "slots(1)", "slots +1"),
        Binding("left_square_bracket", "slots(-1)", "slots −1"),
        Binding("n", "next_quant", "quant"),
        Binding("m", "machine", "machine"),
        Binding("d", "pull", "pull"),
        Binding("s", "serve", "serve"),
        Binding("space", "page_plan", "page the plan", show=False),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]

    def __init__(self, planning: Planning, first: Future[CatalogRecommendation] | None = None) -> None:
        super().__init__()
        self.planning = planning
        #: The planning the last key asked for (``planning`` is the one shown): keys pressed before a
        #: replan lands build on it, and a replan that lands after a newer ask is dropped.
        self.asked = planning
        self.first = first
        self.recommendation: CatalogRecommendation | None = None
        self.rows: list[FitsRow] = []
        self.shown: list[FitsRow] = []
        self.text = ""
        self.fit_filter = "all"
        self.sort = "rank"
        self.reverse = False
        self.selected_key: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="fits-status")
        yield Input(placeholder="filter: words in the model, quant, licence or status (Enter keeps it, Esc clears)", id="fits-filter")
        with Container(id="fits-body"):
            yield DataTable(id="fits-table", cursor_type="row", zebra_stripes=False)
            with VerticalScroll(id="fits-plan-box"):
                yield Static("planning…", id="fits-plan")
        yield Static(id="fits-message")
        yield ProgressBar(id="fits-progress", show_eta=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name, width in _COLUMNS.items():
            table.add_column(name, width=width)
        self.query_one(Input).display = False
        self.query_one(ProgressBar).display = False
        self.query_one("#fits-message").display = False
        self._replan(self.planning, self.first)
        table.focus()

    def on_resize(self) -> None:
        self.query_one("#fits-body").set_class(self.size.width >= 140, "wide")

    # --- planning ------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="plan")
    def _replan(self, planning: Planning, started: Future[CatalogRecommendation] | None = None) -> None:
        """Plan the catalog for ``planning`` off the UI thread (the estimator is pure: ~0.2 s),
        or take the plan ``started`` already (the first, begun before the UI loaded)."""
        try:
            recommendation = started.result() if started is not None else plan_catalog(planning)
        except TierlocalError as exc:
            self.app.call_from_thread(self.say, str(exc), "error")
            return
        self.app.call_from_thread(self._planned, planning, recommendation)
        if started is not None:  # planned in another process: read the catalog here too, so the first key replans as fast as the next
            plan_catalog(planning)

    def _ask(self, planning: Planning) -> None:
        """Replan for ``planning``, the newest ask."""
        self.asked = planning
        self._replan(planning)

    def _planned(self, planning: Planning, recommendation: CatalogRecommendation) -> None:
        if planning is not self.asked:  # a newer key was pressed meanwhile: its replan is coming
            return
        self.planning = planning
        self.recommendation = recommendation
        self.rows = rows_of(recommendation)
        if self.selected_key is None and recommendation.best is not None:
            self.selected_key = recommendation.best.key
        self._refill()

    def _refill(self) -> None:
        """Fill the table from the rows, the filter and the sort; keep the selection."""
        self.shown = visible_rows(self.rows, text=self.text, fit_filter=self.fit_filter, sort=self.sort, reverse=self.reverse)
        table = self.query_one(DataTable)
        table.clear()
        for row in self.shown:
            speed = "-" if row.decode_tokens_per_s is None else f"{row.decode_tokens_per_s:,.1f}" + ("≤" if row.speed_basis == "bound" else "")
            table.add_row(
                Text(row.model),
                Text(row.quant),
                Text(row.status, style=STATUS_STYLES.get(row.status, "")),
                Text("-" if row.score is None else f"{row.score:.1f}", justify="right"),
                Text(speed, justify="right"),
                Text(format_bytes(row.file_bytes), justify="right"),
                Text(f"{row.context_tokens // 1024}k", justify="right"),
                Text(row.licence),
                key=row.key,
            )
        index = next((i for i, row in enumerate(self.shown) if row.key == self.selected_key), 0)
        if self.shown:
            table.move_cursor(row=index)
        self._show_status()
        self._show_plan()

    def _show_status(self) -> None:
        planning = self.planning
        best = self.recommendation.best if self.recommendation else None
        verdict = f"best: {best.entry.family} {best.entry.quant}" if best else "nothing fits"
        filters = f"  filter “{self.text}”" if self.text else ""
        self.query_one("#fits-status", Static).update(
            Text(
                f"{planning.machine_label} · ctx {planning.ctx:,} × {planning.parallel} slot(s) · {planning.purpose} · {verdict} · "
                f"{len(self.shown)}/{len(self.rows)} shown ({self.fit_filter}, by {self.sort}{' reversed' if self.reverse else ''}){filters}"
            )
        )

    def say(self, message: str, severity: str = "information") -> None:
        """Show ``message`` on the line above the keys (plain text: names may hold brackets)."""
        style = {"error": "bold red", "warning": "yellow"}.get(severity, "green")
        line = self.query_one("#fits-message", Static)
        line.update(Text(message, style=style))
        line.display = True

    def selected(self) -> FitsRow | None:
        return next((row for row in self.shown if row.key == self.selected_key), self.shown[0] if self.shown else None)

    def _show_plan(self) -> None:
        row = self.selected()
        panel = self.query_one("#fits-plan", Static)
        if row is None or self.recommendation is None:
            panel.update("no entry matches the filter" if self.rows else "planning…")
            return
        width = max(min(self.query_one("#fits-plan-box").size.width - 2, 60), 20)
        panel.update(plan_renderable(row, width=width))

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None and event.row_key.value != self.selected_key:
            self.selected_key = str(event.row_key.value)
            self._show_plan()

    # --- keys ----------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one(Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#fits-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.text = event.value.strip()
        self._refill()

    @on(Input.Submitted, "#fits-filter")
    def _filter_done(self) -> None:
        self.query_one(DataTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one(Input)
        box.value = ""
        box.display = False
        self.text = ""
        self.query_one(DataTable).focus()
        self._refill()

    def action_page_plan(self) -> None:
        """Scroll the plan a page down; from its end, back to its top."""
        box = self.query_one("#fits-plan-box", VerticalScroll)
        if box.scroll_y >= box.max_scroll_y:
            box.scroll_home(animate=False)
        else:
            box.scroll_page_down(animate=False)

    def action_cycle_fit(self) -> None:
        names = list(FIT_FILTERS)
        self.fit_filter = names[(names.index(self.fit_filter) + 1) % len(names)]
        self._refill()

    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._refill()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._refill()

    def action_ctx(self, factor: float) -> None:
        ctx = min(max(int(self.asked.ctx * factor), MIN_CTX), MAX_CTX)
        if ctx != self.asked.ctx:
            self._ask(replace(self.asked, ctx=ctx))

    def action_slots(self, step: int) -> None:
        parallel = min(max(self.asked.parallel + step, 1), MAX_PARALLEL)
        if parallel != self.asked.parallel:
            self._ask(replace(self.asked, parallel=parallel))

    def action_next_quant(self) -> None:
        row = self.selected()
        if row is None:
            return
        following = next_quant(self.rows, row)
        if following.key not in {shown.key for shown in self.shown}:  # filtered out: show every row again
            self.text, self.fit_filter = "", "all"
            self.query_one(Input).value = ""
        self.selected_key = following.key
        self._refill()

    def action_machine(self) -> None:
        def chosen(result: tuple[Hardware, str] | None) -> None:
            if result is not None:
                hardware, label = result
                self._ask(replace(self.asked, hardware=hardware, machine_label=label))

        self.app.push_screen(MachineDialog(), chosen)

    def action_pull(self) -> None:
        from .actions import pull_selection

        row = self.selected()
        if row is not None:
            pull_selection(self, row)

    def action_serve(self) -> None:
        from .actions import serve_selection

        row = self.selected()
        if row is not None:
            serve_selection(self, row)
