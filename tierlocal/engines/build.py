"""`tierlocal engine build`: llama-server compiled from the llama.cpp sources vendored in the
pinned llama-cpp-python sdist (or a local checkout), for the backend this machine can use,
installed atomically into tierlocal's engine directory.

One compile gives everything that links llama.cpp: the engine is built as shared libraries
(``libllama``, ``libggml*``, ``libmtmd``, as llama.cpp's own release archives ship them) with the
RPC backend, and the server, its tools and the libraries are installed side by side (each binary
finds the libraries beside it: RPATH ``$ORIGIN``). When ``ccache`` is on PATH, llama.cpp's CMake
uses it (its ``GGML_CCACHE`` option), so building the same sources again in a new tree — another
backend, or after the build tree was removed — takes a minute instead of a compile."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import constants
from ..errors import EngineError, UsageError

__all__ = ["BACKENDS", "LLAMA_CPP_PYTHON_PIN", "TOOLS", "EngineInstall", "choose_backend", "cpu_feature_flags", "build_engine", "installed_engines"]

#: The llama-cpp-python release whose vendored llama.cpp tierlocal builds and tests against.
LLAMA_CPP_PYTHON_PIN = "0.3.36"
#: CMake switches per backend (llama.cpp's own option names).
BACKENDS: dict[str, list[str]] = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON"],
    "rocm": ["-DGGML_HIP=ON"],
    "vulkan": ["-DGGML_VULKAN=ON"],
    "metal": ["-DGGML_METAL=ON"],
}
#: The binaries one build installs: the server; the quantiser (``--dry-run`` prints a
#: quantisation's tensor layout without writing it); the GGUF split tool; llama.cpp's RPC server
#: (a device another machine, or another process, lends to ``llama-server --rpc``).
TOOLS = ("llama-server", "llama-quantize", "llama-gguf-split", "ggml-rpc-server")
_COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    # Shared libraries beside the binaries (the run path is the binary's own directory, see
    # _library_flags), so the install directory can move and Python bindings can load the same
    # libllama the server runs.
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DGGML_RPC=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
]
#: x86 CPU features (as /proc/cpuinfo names them) → llama.cpp's switches. AMX is left out: a
#: native build with AMX crashed (SIGSEGV at the first graph) on a VM that reports amx_int8.
_X86_FEATURES = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


@dataclass(frozen=True)
class EngineInstall:
    """One installed engine: its directory, binary and what ``--version`` says."""

    path: Path
    binary: Path
    backend: str
    version: str

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "binary": str(self.binary), "backend": self.backend, "version": self.version}


def choose_backend() -> str:
    """The backend to build for this machine: CUDA when ``nvcc`` is on PATH, ROCm with
    ``hipcc``, Metal on macOS, Vulkan when ``glslc`` (the shader compiler it needs) is there,
    else the CPU."""
    path = constants.search_path()
    if shutil.which("nvcc", path=path):
        return "cuda"
    if shutil.which("hipcc", path=path):
        return "rocm"
    if platform.system() == "Darwin":
        return "metal"
    if shutil.which("glslc", path=path):
        return "vulkan"
    return "cpu"


def cpu_feature_flags(cpuinfo: str | None = None) -> list[str]:
    """CMake switches for this CPU's features instead of ``-march=native`` (GGML_NATIVE): the
    same speed on this machine without features that misbehave under some hypervisors."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    present = set(flags_line.partition(":")[2].split())
    return ["-DGGML_NATIVE=OFF"] + [f"-D{switch}={'ON' if feature in present else 'OFF'}" for feature, switch in _X86_FEATURES.items()]


def _build_tree(source: Path, flags: list[str]) -> Path:
    """The persistent build directory for this source tree and these CMake flags, in the build
    cache: the same build again is incremental (seconds instead of many minutes)."""
    key = hashlib.sha256("\0".join([str(source), *flags]).encode()).hexdigest()[:16]
    tree = constants.build_cache_dir() / f"build-{key}"
    tree.mkdir(parents=True, exist_ok=True)
    return tree


def _cached_source(say: Callable[[str], None]) -> Path:
    """The pinned llama.cpp, downloaded and unpacked into the build cache once."""
    unpacked = constants.build_cache_dir() / f"llama-cpp-python-{LLAMA_CPP_PYTHON_PIN}"
    source = unpacked / f"llama_cpp_python-{LLAMA_CPP_PYTHON_PIN}" / "vendor" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    unpacked.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".source-", dir=unpacked.parent))
    try:
        _fetch_source(staging, say)
        shutil.rmtree(unpacked, ignore_errors=True)
        os.replace(staging, unpacked)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return source


def _fetch_source(workdir: Path, say: Callable[[str], None]) -> Path:
    """Download the pinned llama-cpp-python sdist with pip and unpack its vendored llama.cpp."""
    downloads = workdir / "downloads"
    say(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON_PIN} (source) for its vendored llama.cpp")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        "llama-cpp-python",  # its sdist (the vendored sources); the tools pip builds its metadata with may be wheels
        "--dest",
        str(downloads),
        f"llama-cpp-python=={LLAMA_CPP_PYTHON_PIN}",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    archives = sorted(downloads.glob("llama_cpp_python-*.tar.gz")) if downloads.is_dir() else []
    if done.returncode != 0 or not archives:
        raise EngineError(
            f"could not download llama-cpp-python {LLAMA_CPP_PYTHON_PIN}: {done.stderr.strip()[-300:]}",
            hint="check the network and pip's index, or pass --source DIR (a llama.cpp checkout)",
        )
    with tarfile.open(archives[0]) as archive:
        archive.extractall(workdir, filter="data")
    source = workdir / f"llama_cpp_python-{LLAMA_CPP_PYTHON_PIN}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise EngineError("the downloaded sdist has no vendor/llama.cpp", hint="pass --source DIR (a llama.cpp checkout)")
    return source


def _check_tools(backend: str) -> None:
    missing = [tool for tool in ("cmake", "c++") if not shutil.which(tool, path=constants.search_path())]
    if backend == "vulkan" and not shutil.which("glslc", path=constants.search_path()):
        missing.append("glslc")
    if missing:
        raise UsageError(
            f"cannot build: {', '.join(missing)} not found",
            hint="install a compiler and CMake (Debian: apt install cmake ninja-build g++"
            + (" glslc libvulkan-dev" if backend == "vulkan" else "")
            + ")",
        )


def _run_build(argv: list[str], log, on_progress: Callable[[int, int], None] | None) -> int:  # type: ignore[no-untyped-def]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        if on_progress is not None:
            if match := _NINJA_STEP.match(line):
                on_progress(int(match.group(1)), int(match.group(2)))
            elif match := _MAKE_PERCENT.match(line):
                on_progress(int(match.group(1)), 100)
    return process.wait()


def build_engine(
    backend: str,
    *,
    source: Path | None = None,
    jobs: int | None = None,
    say: Callable[[str], None],
    on_progress: Callable[[int, int], None] | None = None,
) -> EngineInstall:
    """Configure and build ``llama-server`` for ``backend`` and install it into
    ``engine_dir()/llama.cpp-<pin>-<backend>`` (replacing an older build only when the new
    one is complete)."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", hint=f"one of: {', '.join(BACKENDS)}")
    _check_tools(backend)
    engines = constants.engine_dir()
    engines.mkdir(parents=True, exist_ok=True)
    name = f"llama.cpp-{LLAMA_CPP_PYTHON_PIN if source is None else 'local'}-{backend}"
    target = engines / name
    workdir = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=engines))
    try:
        llama_source = source.resolve() if source is not None else _cached_source(say)
        if not (llama_source / "CMakeLists.txt").is_file():
            raise UsageError(f"--source {llama_source}: no CMakeLists.txt there", hint="give the llama.cpp checkout's top directory")
        generator = ["-G", "Ninja"] if shutil.which("ninja", path=constants.search_path()) else []
        cpu_flags = cpu_feature_flags() if platform.machine() in ("x86_64", "AMD64") else []
        flags = [*generator, *_COMMON_FLAGS, *_library_flags(), *cpu_flags, *BACKENDS[backend]]
        build_dir = _build_tree(llama_source, flags)
        log_path = workdir / "build.log"
        with log_path.open("w") as log:
            say(f"configuring llama.cpp for {backend} in {build_dir} (log: {target / 'build.log'})")
            configure = [shutil.which("cmake") or "cmake", "-S", str(llama_source), "-B", str(build_dir), *flags]
            if _run_build(configure, log, None) != 0:
                shutil.rmtree(build_dir, ignore_errors=True)  # a damaged tree: the next build starts clean
                raise EngineError(f"cmake could not configure llama.cpp for {backend}: {_tail(log_path)}", hint=f"see {log_path}")
            say(f"building {', '.join(TOOLS)} with {jobs or os.cpu_count() or 2} jobs; {_compiler_cache()}")
            compile_argv = [shutil.which("cmake") or "cmake", "--build", str(build_dir), "--target", *TOOLS, "-j", str(jobs or os.cpu_count() or 2)]
            if _run_build(compile_argv, log, on_progress) != 0:
                raise EngineError(f"the build failed: {_tail(log_path)}", hint=f"see {log_path}")
        _install(build_dir / "bin", log_path, backend, workdir / "install", target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _describe(target)


def _library_flags() -> list[str]:
    """The run path that makes each binary load the libraries in its own directory."""
    origin = "@loader_path" if platform.system() == "Darwin" else "$ORIGIN"
    return [f"-DCMAKE_INSTALL_RPATH={origin}"]


def _compiler_cache() -> str:
    """What the build uses to skip compiles it has done before, for the progress line."""
    if shutil.which("ccache", path=constants.search_path()):
        return "ccache on PATH: objects compiled before are reused"
    return "no ccache on PATH (Debian: apt install ccache): a new build tree compiles everything"


def _install(built: Path, log_path: Path, backend: str, staged: Path, target: Path) -> None:
    """Stage the binaries and shared libraries of the build tree's ``bin/`` (library symlinks
    kept as links), its build log and its backend name, then swap the stage in for ``target``
    (the old build is removed only once the new one is in place).

    Raises:
        EngineError: the build produced no llama-server.
    """
    (staged / "bin").mkdir(parents=True)
    missing = [tool for tool in TOOLS if not (built / tool).is_file()]
    if missing:
        raise EngineError(f"the build finished without {', '.join('bin/' + tool for tool in missing)}", hint=f"see {log_path}")
    for tool in TOOLS:
        shutil.copy2(built / tool, staged / "bin" / tool)
    for library in sorted([*built.glob("lib*.so*"), *built.glob("lib*.dylib")]):
        shutil.copy2(library, staged / "bin" / library.name, follow_symlinks=False)
    shutil.copy2(log_path, staged / "build.log")
    (staged / "backend").write_text(backend + "\n")
    old = target.parent / f".{target.name}.old"
    if target.exists():
        if old.exists():
            shutil.rmtree(old)
        target.rename(old)
    staged.rename(target)
    if old.exists():
        shutil.rmtree(old)


def _tail(path: Path, lines: int = 3) -> str:
    text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(text[-lines:])


def _describe(directory: Path) -> EngineInstall:
    binary = directory / "bin" / "llama-server"
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
        version = next((line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version:")), "version: unknown")
    except (OSError, subprocess.TimeoutExpired):
        version = "version: does not run"
    backend_file = directory / "backend"
    backend = backend_file.read_text().strip() if backend_file.is_file() else "unknown"
    return EngineInstall(directory, binary, backend, version.removeprefix("version: "))


def installed_engines() -> list[EngineInstall]:
    """Every engine in tierlocal's engine directory."""
    engines = constants.engine_dir()
    if not engines.is_dir():
        return []
    return [_describe(path.parent.parent) for path in sorted(engines.glob("*/bin/llama-server")) if not path.parent.parent.name.startswith(".")]
