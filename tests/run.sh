#!/usr/bin/env bash
# The whole test suite on a fresh machine: virtual environment, dependencies, the linters (ruff
# format and check, mypy), the real test engines and model (built and cached outside the
# checkout by tests/assets/prepare.py), then pytest, in parallel (pytest-xdist: tests marked
# `serial` run alone; see tests/conftest.py). Prints each set-up step's time and the suite's.
# Extra arguments go to pytest (e.g. `bash tests/run.sh -k parse`, or `-n 0` to run one test
# at a time); TIERLOCAL_TEST_WORKERS sets the number of workers (default: 2 per core, at most 8:
# most tests wait on an engine or a socket).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
step_started=$started
took() {
  local now
  now=$(date +%s)
  echo "[run] $1: $(( now - step_started )) s"
  step_started=$now
}

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[run] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
echo "[run] installing tierlocal and test dependencies"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# The checkout's own bytecode, written once: the suite starts `python -m tierlocal` hundreds of
# times, and with PYTHONDONTWRITEBYTECODE set (or a read-only tree) each would compile it again.
.venv/bin/python -m compileall -q -j 0 tierlocal tests bench >/dev/null
took "virtual environment and dependencies"
echo "[run] lint: ruff format --check, ruff check, mypy"
.venv/bin/ruff format --check --quiet .
.venv/bin/ruff check --quiet .
# mypy's incremental cache lives beside the test assets, outside the checkout: a fresh clone
# checks in under a second what took 12 s cold (it re-checks any file whose contents changed).
MYPY_CACHE_DIR="${TIERLOCAL_TEST_CACHE:-$HOME/.cache/tierlocal-test}/mypy" .venv/bin/mypy
took "linters"

.venv/bin/python tests/assets/prepare.py
took "test engines and model (tests/assets/prepare.py)"
# The `--engine python` tests need llama-cpp-python's server: the wheel prepare.py made, which
# carries the CPU engine's own libllama (nothing compiled for it).
wheel=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["llama_cpp_python_wheel"])' "$(.venv/bin/python tests/assets/prepare.py --print-manifest)")
.venv/bin/python -m pip install --quiet "${wheel}[server]"
took "llama-cpp-python wheel installed"

cores=$(nproc 2>/dev/null || echo 2)
workers=${TIERLOCAL_TEST_WORKERS:-$(( cores * 2 > 8 ? 8 : cores * 2 ))}
echo "[run] set-up took $(( $(date +%s) - started )) s; running the tests with ${workers} workers"
suite_started=$(date +%s)
set +e
.venv/bin/python -m pytest -n "$workers" "$@"
status=$?
set -e
echo "[run] tests took $(( $(date +%s) - suite_started )) s (exit ${status}); the whole run $(( $(date +%s) - started )) s"
exit "$status"
