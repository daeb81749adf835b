"""The report stage: what tierlocal shows an operator beyond the terminal — charts drawn
server-side as SVG (:mod:`.svg`), from the same figures the ``--json`` commands print."""
