"""The machine key's dialog: the GPU(s) and RAM to plan for, spelt as ``--gpu`` and ``--ram``
take them (blank: what is detected here); a value that is not one stays in the dialog with
the one-line error ``check`` would print."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from ..errors import TierlocalError
from ..hardware.detect import detect
from ..hardware.override import with_gpu_override, with_ram_override
from ..hardware.types import Hardware
from .planning import machine_label

__all__ = ["MachineDialog"]


class MachineDialog(ModalScreen[tuple[Hardware, str] | None]):
    """Ask for ``--gpu`` and ``--ram``; dismiss with the machine and its label, or None (Esc)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]  # noqa: RUF012 (Textual's own class attribute)

    def compose(self) -> ComposeResult:
        with Vertical(id="machine-dialog"):
            yield Label("Plan for which machine? Enter applies, Esc cancels.")
            yield Input(placeholder="GPU: 24GiB, RTX 4090, 2xRTX 3090, M4 Max 64GB, none — blank: detected", id="machine-gpu")
            yield Input(placeholder="RAM: 32GiB — blank: detected", id="machine-ram")
            yield Static(id="machine-error")

    def on_mount(self) -> None:
        self.query_one("#machine-gpu", Input).focus()

    @on(Input.Submitted)
    def _apply(self, event: Input.Submitted) -> None:
        if event.input.id == "machine-gpu":
            self.query_one("#machine-ram", Input).focus()
            return
        gpu_text = self.query_one("#machine-gpu", Input).value.strip()
        ram = self.query_one("#machine-ram", Input).value.strip() or None
        gpus = [part.strip() for part in gpu_text.split(",") if part.strip()]
        try:
            hardware = with_ram_override(with_gpu_override(detect(), gpus), ram, None)
        except TierlocalError as exc:
            self.query_one("#machine-error", Static).update(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""))
            return
        self.dismiss((hardware, machine_label(gpus, ram)))

    def action_cancel(self) -> None:
        self.dismiss(None)
