"""For models that do not fit one machine: tier 1 (rent a cluster) and tier 3 (the hosted API).

:mod:`.arithmetic` (the formulas) and :mod:`.plan` (the answer ``tierlocal plan`` gives) are
pure; :mod:`.facts` gathers what is known about a model (recipes/, a GGUF header, a hub repo's
config.json) and :mod:`.break_even` weighs measured usage against renting — both at the edge.
"""
