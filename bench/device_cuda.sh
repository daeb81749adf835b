#!/usr/bin/env bash
# On a lent NVIDIA machine (the device tool's `run`): tierlocal's detection and plans on the real
# GPU, then llama.cpp built for CUDA from the pinned sources, and the steps STEPS names
# (default "loads"):
#   loads  `tierlocal serve` loads of sparse models of real shapes, the plan against CUDA's own
#          buffers (bench/cuda_loads.py; builds llama-server);
#   speed  llama-bench pp512/tg128 of the shapes the catalog ranks (bench/cuda_speed.py measure;
#          builds llama-bench): compare them here with `python -m bench.cuda_speed compare`.
#
# It needs, carried in the working tree (both ignored by git):
#   .whl/                         wheels the machine's Python lacks: gguf, httpx2, httpcore2,
#                                 truststore (pip download … --python-version 3.12 --platform …)
#   .device/llama.cpp-src.tar.xz  the llama.cpp vendored in the pinned llama-cpp-python sdist
#                                 (tests/assets/prepare.py unpacks it into the test cache), without
#                                 docs/, models/, tests/, examples/ and benches/
# Results go to $OUT (at most 8 files come back): nvidia-smi.csv, hw.json, check.json,
# loads.json, speed.json, build-tail.log. BUILD_TIMEOUT (seconds, default 420) bounds the compile;
# SPEED_BUDGET (seconds, default 240) bounds the speed step's new cases.
set -uo pipefail
OUT=${OUT:-/tmp/tierlocal-device}
STEPS=${STEPS:-loads}
targets=()
case " $STEPS " in *" loads "*) targets+=(llama-server) ;; esac
case " $STEPS " in *" speed "*) targets+=(llama-bench) ;; esac
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 TIERLOCAL_HOME=/tmp/tierlocal-home

echo "== the GPU as its driver reports it"
nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
echo "== tierlocal hw and check on it"
python3 -m tierlocal hw --json > "$OUT/hw.json" && python3 -m tierlocal hw
python3 -m tierlocal check --json > "$OUT/check.json" && python3 -m tierlocal check | head -30

echo "== ${targets[*]} for CUDA (sm_90) from the pinned sources"
mkdir -p /tmp/src && tar -C /tmp/src -xJf .device/llama.cpp-src.tar.xz
started=$(date +%s)
cmake -S /tmp/src/llama.cpp -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build-tail.log" 2>&1 || { tail -30 "$OUT/build-tail.log"; exit 1; }
if ! timeout "${BUILD_TIMEOUT:-420}" cmake --build /tmp/build --target "${targets[@]}" -j "$(nproc)" > /tmp/build.log 2>&1; then
  tail -40 /tmp/build.log | tee "$OUT/build-tail.log"
  echo "build did not finish (exit or timeout) after $(( $(date +%s) - started )) s"
  exit 1
fi
tail -5 /tmp/build.log > "$OUT/build-tail.log"
echo "built in $(( $(date +%s) - started )) s"

case " $STEPS " in *" speed "*)
  echo "== llama-bench on the CUDA build: the shapes the catalog ranks (bench/cuda_speed.py)"
  python3 -m bench.cuda_speed measure --llama-bench /tmp/build/bin/llama-bench --models /tmp/models --json "$OUT/speed.json" \
    --budget-s "${SPEED_BUDGET:-240}"
  ;;
esac
case " $STEPS " in *" loads "*)
  /tmp/build/bin/llama-server --version 2>&1 | head -2
  /tmp/build/bin/llama-server --list-devices 2>&1 | tail -3
  echo "== tierlocal serve on the CUDA build: the plan against the buffers llama.cpp allocates"
  python3 -m bench.cuda_loads --llama-server /tmp/build/bin/llama-server --models /tmp/models --json "$OUT/loads.json"
  ;;
esac
