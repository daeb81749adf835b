"""The rules recipes/quality.toml states for its figures, checked against every figure. Pure.

A figure may contradict its file in three ways, each a rule of the file's own
(``[[mode_rule]]``, ``[[mode_words]]``, ``[[version_rule]]``):

- its model is one whose figures may be in some modes only (a model without a thinking mode;
  a card whose tables run thinking), and it is recorded in another;
- its ``setting`` names a mode (``non-thinking``, ``reasoning on``, ``thinking mode presumably
  on``…) and it is recorded in the other: the longest of the file's mode words that appears in
  the setting decides (``non-thinking mode`` over ``thinking mode``), and words of the
  ``unstated`` kind (``thinking mode not stated``) leave the mode to the model's rule;
- its ``setting`` names a version of its benchmark (``LiveCodeBench v6``, ``AIME 2024``,
  ``Arena-Hard v2``) and it is recorded under another version: versions are kept apart.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from ..published import ModeWords, QualityFigure, QualityRules

__all__ = ["broken_rules", "named_mode"]


def named_mode(setting: str, words: Sequence[ModeWords]) -> str | None:
    """The mode ``setting`` names: that of the longest mode word in it (None: none, or a tie
    between modes — a setting to reword; ``unstated``: it says the source does not tell)."""
    text = setting.lower()
    found = [(len(word), entry.mode) for entry in words for word in entry.words if word in text]
    if not found:
        return None
    longest = max(length for length, _ in found)
    modes = {mode for length, mode in found if length == longest}
    return modes.pop() if len(modes) == 1 else None


def broken_rules(figures: Sequence[QualityFigure], rules: QualityRules) -> list[str]:
    """One line per figure that contradicts a rule: which figure, what it says, what the rule says."""
    broken = []
    for figure in figures:
        where = f"{figure.model} {figure.benchmark} ({figure.mode}, {figure.score:g}, {figure.source})"
        for rule in rules.modes:
            applies = any(fnmatch.fnmatchcase(figure.model, pattern) for pattern in rule.models)
            applies = applies and (not rule.sources or figure.source.startswith(rule.sources))
            if applies and figure.mode not in rule.modes:
                broken.append(f"{where}: {figure.model}'s figures are {' or '.join(rule.modes)} — {rule.why}")
        named = named_mode(figure.setting, rules.words)
        if named is not None and named != "unstated" and named != figure.mode:
            broken.append(f"{where}: its setting says {named} ({figure.setting!r})")
        versions = [rule for rule in rules.versions if figure.benchmark.startswith(rule.family)]
        named_versions = {rule.benchmark for rule in versions if re.search(rule.pattern, figure.setting)}
        if named_versions and figure.benchmark not in named_versions:
            broken.append(f"{where}: its setting names {' or '.join(sorted(named_versions))}, kept apart from {figure.benchmark}")
    return broken
