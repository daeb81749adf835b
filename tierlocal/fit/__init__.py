"""The pure core: what a model needs on a machine and the plan that fits it.

:mod:`.model` (the architecture facts from a GGUF header), :mod:`.memory` (llama.cpp's rules:
context, KV cache, placement, buffers), :mod:`.estimate` (per-device memory and the planner),
:mod:`.speed` (decode speed by bandwidth), :mod:`.source` (one model on one machine, as
``check`` and ``serve`` plan it), :mod:`.rule_of_thumb` (the catalog recommendation) and
:mod:`.verify` (a load against its plan). No I/O: every input comes in as an argument.
"""
