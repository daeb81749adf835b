"""The pure core: what a model needs on a machine and the plan that fits it.

:mod:`.model` (the architecture facts from a GGUF header), :mod:`.memory` (llama.cpp's rules:
context, KV cache, placement, buffers), :mod:`.estimate` (per-device memory and the planner),
:mod:`.speed` (decode and prefill speed), :mod:`.gpu_speed` (a GPU's speed fitted to published
rows), :mod:`.host_memory` (the host's peak memory). It imports nothing above it: no catalog,
no engine, no hardware probe (those are :mod:`tierlocal.plan`'s). No I/O: every input comes in
as an argument.
"""
