"""`tierlocal engine build` compiles a real llama-server (from the llama.cpp the tests pin),
`engine list` finds it, and `serve` runs it with nothing else configured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.doc_json import assert_documented
from tests.support.engines import ENGINE_THREADS, first_json_document, free_port


@pytest.mark.parametrize(("tools", "backend"), [(["nvcc", "glslc"], "cuda"), (["hipcc"], "rocm"), (["glslc"], "vulkan"), ([], "cpu")])
def test_backend_follows_the_tools_on_path(tmp_path: Path, tools: list[str], backend: str) -> None:
    for tool in tools:
        stub = tmp_path / tool
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    probe = "from tierlocal.engines.build import choose_backend; print(choose_backend())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "PATH": str(tmp_path)}, check=True)
    assert result.stdout.strip() == backend


def _ccache_misses() -> int:
    """Compiles ccache could not serve from its cache so far (its machine-readable counters)."""
    stats = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, check=True).stdout
    counters = dict(line.split("\t", 1) for line in stats.splitlines() if "\t" in line)
    return int(counters["cache_miss"])


def test_build_list_and_serve_with_the_built_engine(assets: Assets, tmp_path: Path) -> None:
    """The build tree lives in the build cache, next to the test assets (outside the checkout),
    where tests/assets/prepare.py built the suite's own CPU engine with this same command: the
    build here compiles nothing new (ccache counts no miss), then installs the server, its tools
    and the shared libraries they load."""
    build_cache = assets.llama_cpp_source.parent.parent / "engine-build"
    env = {"TIERLOCAL_HOME": str(tmp_path / "home"), "TIERLOCAL_BUILD_CACHE": str(build_cache)}
    misses = _ccache_misses()
    built = run_cli("engine", "build", "--backend", "cpu", "--source", str(assets.llama_cpp_source), "--json", env=env, timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    assert _ccache_misses() == misses  # the same sources again: no compile
    assert any((tree / "bin" / "llama-server").is_file() for tree in build_cache.glob("build-*"))  # kept for the next build
    result = json.loads(built.stdout)
    assert_documented("engine-build", result)
    assert_documented("engine-list", json.loads(run_cli("engine", "list", "--json", env=env).stdout))
    binary = Path(result["binary"])
    assert binary == tmp_path / "home" / "engines" / "llama.cpp-local-cpu" / "bin" / "llama-server"
    assert result["backend"] == "cpu" and result["version"].startswith("0.")
    assert [p.name for p in binary.parent.parent.parent.iterdir()] == ["llama.cpp-local-cpu"]  # no staging left
    assert "ccache found" in (binary.parent.parent / "build.log").read_text()  # llama.cpp's CMake took the compiler cache
    for tool in ("llama-quantize", "llama-gguf-split", "ggml-rpc-server"):
        assert subprocess.run([str(binary.parent / tool), "--help"], capture_output=True, check=False).returncode in (
            0,
            1,
        )  # runs: its libraries load
    assert (binary.parent / "libllama.so").exists() and (binary.parent / "libggml-rpc.so").exists()
    # With no llama-server on PATH and none configured, tierlocal finds and uses the built one.
    bare = {**env, "PATH": "/usr/bin:/bin", "TIERLOCAL_LLAMA_SERVER": ""}
    listed = run_cli("engine", "list", "--json", env=bare)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["selected"] == str(binary)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierlocal",
            "serve",
            str(assets.gemma_gguf),
            "--ctx",
            "2048",
            "--threads",
            ENGINE_THREADS,
            "--port",
            str(free_port()),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **bare},
        cwd=REPO_ROOT,
    )
    try:
        ready = first_json_document(process)
        assert ready["argv"][0] == str(binary)
        assert ready["delta"]["verified"] is True
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 0


def test_cpu_features_become_switches_without_native_or_amx() -> None:
    from tierlocal.engines.build import cpu_feature_flags

    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512vbmi amx_int8 amx_tile\n"
    flags = cpu_feature_flags(cpuinfo)
    assert flags[0] == "-DGGML_NATIVE=OFF"
    assert {"-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512_BF16=OFF"} <= set(flags)
    assert not any("AMX" in flag for flag in flags)
