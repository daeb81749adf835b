#!/usr/bin/env bash
# The whole test suite on a fresh machine: virtual environment, dependencies, the linters (ruff
# format and check, mypy), the real test engines and model (built and cached outside the
# checkout by tests/assets/prepare.py), then pytest. Extra arguments go to pytest (e.g.
# `bash tests/run.sh -k parse`).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[run] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
echo "[run] installing tierlocal and test dependencies"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
echo "[run] lint: ruff format --check, ruff check, mypy"
.venv/bin/ruff format --check --quiet .
.venv/bin/ruff check --quiet .
.venv/bin/mypy

.venv/bin/python tests/assets/prepare.py
# The `--engine python` tests need llama-cpp-python's server: the wheel prepare.py compiled.
wheel=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["llama_cpp_python_wheel"])' "$(.venv/bin/python tests/assets/prepare.py --print-manifest)")
.venv/bin/python -m pip install --quiet "${wheel}[server]"
echo "[run] set-up took $(( $(date +%s) - started )) s; running the tests"
exec .venv/bin/python -m pytest "$@"
