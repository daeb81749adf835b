"""Copies of a real GGUF with another chat template, written by the gguf package's own
``gguf_new_metadata`` script (every tensor copied, the metadata changed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["with_chat_template"]


def with_chat_template(source: Path, out: Path, template: str) -> Path:
    """``source`` copied to ``out`` with ``tokenizer.chat_template`` set to ``template``."""
    done = subprocess.run(
        [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--force", "--chat-template", template, str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out
