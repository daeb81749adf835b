"""The OpenAI-compatible fallback gateway: :mod:`.config` (the TOML contract), :mod:`.app` (the
server and its one retry loop), :mod:`.relay` (one attempt on one upstream), :mod:`.ledger`
(budgets and usage rows), :mod:`.store` (SQLite or Redis), :mod:`.runner` (running it), and the
pure rules in :mod:`.protocol`, :mod:`.pricing` and :mod:`.limits`."""
