"""``python -m tierlocal`` runs the CLI."""

from .cli import main

main()
