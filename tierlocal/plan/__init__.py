"""One model on one machine, planned: the layer above the pure estimator (:mod:`tierlocal.fit`),
the catalog and the engines' command lines, that ``check`` and ``serve`` share.

:mod:`.source` (a file or catalog name planned for a machine, with the engine's command line),
:mod:`.recommend` (the catalog ranked for a machine), :mod:`.rule_of_thumb` (the library's
quick recommendation) and :mod:`.verify` (a load log against its plan). Pure: every input comes
in as an argument.
"""
