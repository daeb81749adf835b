"""``tierlocal ui``'s application: three screens, What fits (1), Live (2) and Hub (3), keyboard first
(mouse optional), laid out for 80×24 and up; ``q`` or Ctrl-C quits."""

from __future__ import annotations

from concurrent.futures import Future

from textual.app import App
from textual.binding import Binding

from ..gateway.config import GatewayConfig
from ..plan.candidates import CatalogRecommendation
from .fits import FitsScreen
from .planning import Planning

__all__ = ["TierlocalApp"]

_CSS = """
#fits-status, #live-summary { height: auto; padding: 0 1; background: $boost; }
#fits-filter { height: 3; }
#fits-body { height: 1fr; layout: vertical; }
#fits-body.wide { layout: horizontal; }
#fits-table { height: 1fr; min-height: 5; }
#fits-plan-box { height: 1fr; padding: 0 1; border-top: solid $primary; }
#fits-body.wide #fits-table { width: 1fr; height: 1fr; }
#fits-body.wide #fits-plan-box { width: 1fr; height: 1fr; border-top: none; border-left: solid $primary; }
#fits-progress { height: 1; padding: 0 1; }
#fits-message { height: auto; max-height: 3; padding: 0 1; }
#live-body { height: 1fr; padding: 0 1; }
#hub-status { height: auto; padding: 0 1; background: $boost; }
#hub-table { height: 1fr; }
#live-engines { height: auto; }
.engine { height: auto; margin-bottom: 1; }
.engine-text { height: auto; }
.spark { height: 2; }
.spark Label { width: 14; }
.spark Sparkline { width: 1fr; height: 2; }
#live-gateway, #live-spend { height: auto; margin-bottom: 1; }
MachineDialog { align: center middle; }
#machine-dialog { width: 76; height: auto; padding: 1 2; border: round $primary; background: $surface; }
#machine-error { color: $error; height: auto; }
"""


class TierlocalApp(App[None]):
    """What fits this machine, and what runs on it."""

    TITLE = "tierlocal"
    CSS = _CSS
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [  # noqa: RUF012 (Textual's own class attribute)
        Binding("1", "show('fits')", "what fits"),
        Binding("2", "show('live')", "live"),
        Binding("3", "show('hub')", "hub"),
        Binding("question_mark", "show_help_panel", "keys"),
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
    ]

    def __init__(
        self, planning: Planning, gateway_config: GatewayConfig | None, *, start_on: str = "fits", first: Future[CatalogRecommendation] | None = None
    ) -> None:
        super().__init__()
        self.planning = planning
        self.gateway_config = gateway_config
        self.start_on = start_on
        self.first = first

    def on_mount(self) -> None:
        self.install_screen(FitsScreen(self.planning, self.first), "fits")
        self._install(self.start_on)
        self.push_screen(self.start_on)

    def _install(self, name: str) -> None:
        """Live and Hub are made when first shown (their HTTP clients are a tenth of a second to import)."""
        if name == "live" and not self.is_screen_installed("live"):
            from .live import LiveScreen

            self.install_screen(LiveScreen(self.gateway_config), "live")
        if name == "hub" and not self.is_screen_installed("hub"):
            from .hub import HubScreen

            self.install_screen(HubScreen(self.planning), "hub")

    def action_show(self, name: str) -> None:
        self._install(name)
        if self.screen is not self.get_screen(name):
            self.switch_screen(name)
