"""How a model set's joint plan reads on a terminal: one row per member with its bytes on each
device, the groups that may be resident together, and each member's command."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..plan.model_set import MemberPlan, SetPlan
from ..plan.set_file import SetSettings
from ..plan.where import where_text
from ..units import format_bytes
from .common import console

__all__ = ["render_set_plan"]


def render_set_plan(plan: SetPlan, settings: SetSettings) -> None:
    """The members' table, the resident groups, the verdict and the commands."""
    out = console()
    table = Table(title=f"A set of {len(plan.members)} models, planned together")
    for column in ("member", "role", "kept", "runs on", "context × slots", *plan.device_names, "decode", "verdict"):
        table.add_column(column, justify="right" if column in plan.device_names else "left")
    for member in plan.members:
        table.add_row(*_row(member))
    budget = ["", "", "", "", "budget (free less margin)", *(format_bytes(b) for b in plan.budget_bytes), "", ""]
    table.add_row(*budget, style="dim")
    out.print(table)
    for group in plan.resident_groups:
        used = ", ".join(f"{name} {format_bytes(b)}" for name, b in zip(plan.device_names, plan.resident_bytes(group), strict=True))
        out.print(f"Resident together: {', '.join(group)} ({used}).")
    for member in plan.members:
        if member.shrunk:
            out.print(f"[bold yellow]{escape(member.member.name)}[/bold yellow] {escape(member.shrunk)}.")
    out.print(f"Verdict: {_verdict(plan, settings)}")
    for member in plan.members:
        if member.fits:
            out.print(f"[bold]{escape(member.member.name)}[/bold]: {escape(' '.join(member.command))}")


def _row(member: MemberPlan) -> list[str]:
    check, asked = member.check, member.member
    estimate = check.estimate
    kept = "pinned" if asked.pinned else f"idle {asked.idle_unload_s:g} s" if asked.idle_unload_s else "on demand"
    shape = f"{estimate.params.n_ctx_seq:,} × {estimate.params.n_seq_max}" if estimate else "-"
    speed = check.headline.decode_tokens_per_s
    decode = f"~{speed:,.1f} tok/s" if speed else "-"
    verdict = ("fits" + (" (--load-mode none)" if member.load_mode == "none" else "")) if member.fits else f"does not fit: {member.reason}"
    return [asked.name, asked.role, kept, where_text(check), shape, *(format_bytes(b) for b in member.device_bytes), decode, escape(verdict)]


def _verdict(plan: SetPlan, settings: SetSettings) -> str:
    if not plan.fits:
        missing = ", ".join(m.member.name for m in plan.members if not m.fits)
        return f"the set does not fit: {missing} cannot load beside the pinned members."
    if plan.all_resident:
        return "every member fits at once: nothing is unloaded for memory."
    return (
        f"every member can load, but not all at once: loading one unloads the least recently used unpinned member(s) until it fits; "
        f"any {plan.max_resident} fit together whichever they are; a request waits up to {settings.load_wait_s:g} s for its member to load."
    )
