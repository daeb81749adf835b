"""Every command's output on fixed inputs, for a refactor that must not change behaviour.

Runs a fixed list of ``tierlocal`` invocations (help texts, tables, ``--json``, error paths) on
the Gemma file and sparse GGUFs of real shapes, each in a fresh process against one checkout,
with the machine pinned (psutil's RAM, cores and disk figures are fixed, so two runs on the same
code are byte-identical), and writes one file per invocation: exit code, stdout, stderr.

    python -m tests.support.cli_snapshot --checkout . --out /tmp/after --gemma GEMMA.gguf --models DIR
    diff -r /tmp/before /tmp/after

``--checkout`` is the tree whose ``tierlocal`` package is run (a ``git worktree`` of the commit
before the change gives the "before" side). ``--models`` holds the sparse GGUFs (written there
with tests/support/sparse_models.py when missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: Runs inside each child: pins what psutil reports, then runs the CLI with the given argv.
_BOOTSTRAP = """
import sys, collections, psutil
Memory = collections.namedtuple("Memory", "total available percent used free")
Disk = collections.namedtuple("Disk", "total used free percent")
psutil.virtual_memory = lambda: Memory(24 * 2**30, 20 * 2**30, 16.7, 4 * 2**30, 20 * 2**30)
psutil.cpu_count = lambda logical=True: 4 if logical else 2
psutil.disk_usage = lambda path: Disk(500 * 10**9, 400 * 10**9, 100 * 10**9, 80.0)
from tierlocal.cli import main
main(sys.argv[1:])
"""

_SPARSE = ("llama-3-8b-q4k", "qwen3-30b-a3b-q4k", "deepseek-v2-lite-q4k", "lfm2-1.2b-q4k")
_HELP = [
    (),
    ("inspect",),
    ("hw",),
    ("check",),
    ("plan",),
    ("pull",),
    ("serve",),
    ("status",),
    ("service",),
    ("service", "install"),
    ("service", "install", "serve"),
    ("service", "install", "gateway"),
    ("service", "status"),
    ("engine",),
    ("engine", "build"),
    ("engine", "list"),
    ("gateway",),
    ("gateway", "keys"),
    ("gateway", "keys", "add"),
    ("gateway", "keys", "list"),
    ("gateway", "keys", "revoke"),
    ("usage",),
]


def cases(gemma: str, models: Path, state: Path, vulkan: str | None) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, argv, extra environment) for every invocation."""
    config = state / "gateway.toml"
    out: list[tuple[str, list[str], dict[str, str]]] = []
    for command in _HELP:
        out.append(("help-" + ("-".join(command) or "top"), [*command, "--help"], {}))
    out += [
        ("version", ["--version"], {}),
        ("no-args", [], {}),
        ("unknown-command", ["frobnicate"], {}),
        ("inspect-gemma", ["inspect", gemma], {}),
        ("inspect-gemma-json", ["inspect", gemma, "--json"], {}),
        ("inspect-missing", ["inspect", "/nonexistent/model.gguf"], {}),
        ("inspect-not-gguf", ["inspect", "/etc/hostname"], {}),
        ("inspect-bad-hf", ["inspect", "hf://only-owner"], {}),
        ("hw", ["hw"], {}),
        ("hw-json", ["hw", "--json"], {}),
        ("hw-gpu-24", ["hw", "--gpu", "24GiB"], {}),
        ("hw-gpu-2xh100-json", ["hw", "--gpu", "2xH100", "--json"], {}),
        ("hw-gpu-bad", ["hw", "--gpu", "warp-drive"], {}),
        ("check", ["check"], {}),
        ("check-json", ["check", "--json"], {}),
        ("check-24", ["check", "--gpu", "24GiB", "--ctx", "32768"], {}),
        ("check-4090-p4", ["check", "--gpu", "RTX 4090", "--parallel", "4"], {}),
        ("check-2xh100-json", ["check", "--gpu", "2xH100", "--json"], {}),
        ("check-2x3090", ["check", "--gpu", "2xRTX 3090"], {}),
        ("check-16-json", ["check", "--gpu", "16GiB", "--json"], {}),
        ("check-80", ["check", "--gpu", "80GiB", "--min-speed", "1"], {}),
        ("check-kimi", ["check", "kimi-k3"], {}),
        ("check-kimi-json", ["check", "kimi-k3", "--json"], {}),
        ("check-qwen3-8b-json", ["check", "qwen3-8b", "--gpu", "24GiB", "--json"], {}),
        ("check-catalog-max", ["check", "--ctx", "max"], {}),
        ("check-unknown-name", ["check", "no-such-model"], {}),
        ("check-missing-file", ["check", "/nonexistent/model.gguf"], {}),
        ("check-bad-ctx", ["check", gemma, "--ctx", "12"], {}),
        ("check-bad-parallel", ["check", gemma, "--parallel", "0"], {}),
        ("check-bad-cache", ["check", gemma, "--cache-type-k", "q3_x"], {}),
        ("check-gemma", ["check", gemma], {}),
        ("check-gemma-json", ["check", gemma, "--json"], {}),
        ("check-gemma-ctxmax", ["check", gemma, "--ctx", "max"], {}),
        ("check-gemma-parmax-json", ["check", gemma, "--ctx", "4096", "--parallel", "max", "--json"], {}),
        ("check-gemma-auto-json", ["check", gemma, "--parallel", "auto", "--json"], {}),
        ("check-gemma-q8-json", ["check", gemma, "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--ubatch", "256", "--json"], {}),
        ("check-gemma-gpu1", ["check", gemma, "--gpu", "1GiB"], {}),
        ("check-gemma-gpu1-ngl5-json", ["check", gemma, "--gpu", "1GiB", "--ngl", "5", "--flash-attn", "off", "--json"], {}),
        ("check-gemma-gpu200m", ["check", gemma, "--gpu", "200MiB"], {}),
    ]
    for name in _SPARSE:
        path = str(models / f"{name}.gguf")
        out += [
            (f"inspect-{name}", ["inspect", path], {}),
            (f"check-{name}", ["check", path], {}),
            (f"check-{name}-8g-json", ["check", path, "--gpu", "8GiB", "--ctx", "16384", "--json"], {}),
            (f"check-{name}-4090-max", ["check", path, "--gpu", "RTX 4090", "--ctx", "max"], {}),
            (f"plan-{name}-json", ["plan", path, "--json"], {}),
        ]
    out += [
        (
            "check-moe-ncpumoe-json",
            ["check", str(models / "qwen3-30b-a3b-q4k.gguf"), "--gpu", "12GiB", "--n-cpu-moe", "20", "--ngl", "49", "--json"],
            {},
        ),
        ("plan-kimi", ["plan", "kimi-k3"], {}),
        ("plan-kimi-json", ["plan", "kimi-k3", "--json"], {}),
        ("plan-kimi-sources", ["plan", "kimi-k3", "--sources"], {}),
        ("plan-kimi-h200", ["plan", "kimi-k3", "--gpu", "H200", "--rate", "3.5", "--tokens-per-month", "2B"], {}),
        ("plan-kimi-blend-json", ["plan", "kimi-k3", "--input-share", "0.5", "--cache-hit", "0", "--monthly-cost", "50000", "--json"], {}),
        ("plan-kimi-hours", ["plan", "kimi-k3", "--hours-per-day", "4", "--bandwidth", "10Gbit/s"], {}),
        ("plan-llama70-fp8", ["plan", "llama-3.3-70b", "--precision", "fp8"], {}),
        ("plan-gemma-json", ["plan", gemma, "--json"], {}),
        ("plan-gemma", ["plan", gemma], {}),
        ("plan-unknown", ["plan", "no-such-model"], {}),
        ("plan-shares-bad", ["plan", "kimi-k3", "--input-share", "0.5", "--output-share", "0.6"], {}),
        ("plan-active-bad", ["plan", "kimi-k3", "--active", "3T"], {}),
        ("plan-precision-bad", ["plan", "kimi-k3", "--precision", "fp3"], {}),
        ("plan-hf-offline", ["plan", "hf://owner/repo"], {"HF_ENDPOINT": "http://127.0.0.1:9"}),
        ("pull-hf-offline", ["pull", "hf://owner/repo", "--quant", "Q4_K_M"], {"HF_ENDPOINT": "http://127.0.0.1:9"}),
        ("pull-catalog-offline", ["pull", "qwen3-8b"], {"HF_ENDPOINT": "http://127.0.0.1:9"}),
        ("pull-none-offline-json", ["pull", "--json", "--gpu", "8GiB"], {"HF_ENDPOINT": "http://127.0.0.1:9"}),
        ("pull-bad-source", ["pull", "nothing-like-this"], {}),
        ("pull-bad-hf", ["pull", "hf://owner/repo/file.bin"], {}),
        ("pull-ollama-empty", ["pull", "ollama://"], {}),
        ("pull-ollama-down", ["pull", "ollama://qwen3:8b"], {"OLLAMA_HOST": "127.0.0.1:9"}),
        ("serve-missing-binary", ["serve", gemma, "--llama-server", "/nonexistent/llama-server"], {}),
        ("serve-missing-model", ["serve", "/nonexistent/model.gguf", "--llama-server", "/bin/true"], {}),
        ("serve-exposed", ["serve", gemma, "--host", "0.0.0.0", "--llama-server", "/bin/true"], {}),
        ("serve-not-catalog", ["serve", "no-such-model"], {}),
        ("serve-hf-not-pulled", ["serve", "hf://owner/repo/file.gguf"], {"HF_ENDPOINT": "http://127.0.0.1:9"}),
        ("serve-ollama-exposed", ["serve", gemma, "--engine", "ollama", "--host", "0.0.0.0"], {}),
        ("serve-ollama-tag-missing", ["serve", "ollama://gemma3:270m", "--engine", "ollama"], {"OLLAMA_MODELS": str(state / "ollama")}),
        ("serve-ollama-tag-bad", ["serve", "ollama://bad tag!"], {}),
        ("status-none", ["status"], {}),
        ("status-port-none-json", ["status", "--port", "8999", "--json"], {}),
        (
            "service-serve-dry",
            ["service", "install", "serve", gemma, "--llama-server", "/bin/true", "--ctx", "2048", "--parallel", "2", "--dry-run"],
            {},
        ),
        ("service-serve-dry-key", ["service", "install", "serve", gemma, "--llama-server", "/bin/true", "--host", "0.0.0.0", "--dry-run"], {}),
        ("service-serve-ollama-dry", ["service", "install", "serve", gemma, "--engine", "ollama", "--parallel", "2", "--dry-run"], {}),
        ("service-serve-ollama-port-dry", ["service", "install", "serve", gemma, "--engine", "ollama", "--port", "11500", "--dry-run"], {}),
        ("service-serve-missing", ["service", "install", "serve", "/nonexistent/model.gguf", "--dry-run"], {}),
        ("service-gateway-dry", ["service", "install", "gateway", "--dry-run"], {}),
        ("service-gateway-config-dry", ["service", "install", "gateway", "--config", str(config), "--dry-run"], {}),
        ("service-gateway-bad-cred", ["service", "install", "gateway", "--credential", "nonsense", "--dry-run"], {}),
        ("service-status", ["service", "status"], {"PATH": "/nonexistent"}),
        ("engine-list-json", ["engine", "list", "--json"], {"PATH": "/usr/bin:/bin"}),
        ("engine-list", ["engine", "list"], {"PATH": "/usr/bin:/bin"}),
        ("engine-build-bad-source", ["engine", "build", "--backend", "cpu", "--source", str(state)], {}),
        ("gateway-keys-list", ["gateway", "keys", "list", "--config", str(config)], {}),
        ("gateway-keys-list-json", ["gateway", "keys", "list", "--config", str(config), "--json"], {}),
        ("gateway-keys-add-unknown", ["gateway", "keys", "add", "mallory", "--config", str(config)], {}),
        ("gateway-keys-revoke-none", ["gateway", "keys", "revoke", "bob", "--config", str(config)], {}),
        ("gateway-bad-config", ["gateway", "--config", str(state / "missing.toml")], {}),
        ("usage-json", ["usage", "--config", str(config), "--json"], {}),
        ("usage", ["usage", "--config", str(config)], {}),
    ]
    if vulkan:
        with_gpu = {"TIERLOCAL_LLAMA_SERVER": vulkan, "GGML_VK_VISIBLE_DEVICES": "0"}
        out += [
            ("vk-hw-json", ["hw", "--json"], with_gpu),
            ("vk-check", ["check"], with_gpu),
            ("vk-check-gemma", ["check", gemma], with_gpu),
            ("vk-check-gemma-json", ["check", gemma, "--ctx", "32768", "--json"], with_gpu),
            ("vk-check-llama8b", ["check", str(models / "llama-3-8b-q4k.gguf")], with_gpu),
            ("vk-check-moe-json", ["check", str(models / "qwen3-30b-a3b-q4k.gguf"), "--ctx", "4096", "--json"], with_gpu),
            ("vk-check-gemma-24-json", ["check", gemma, "--gpu", "24GiB", "--json"], with_gpu),
        ]
    return out


_GATEWAY_CONFIG = """\
[server]
host = "127.0.0.1"
port = 8088
state_dir = "{state}/gateway"

[[routes]]
model = "kimi-k3"
targets = [ {{ url = "https://api.moonshot.ai/v1", model = "kimi-k3", api_key_env = "MOONSHOT_API_KEY" }} ]

[prices."kimi-k3"]
input_cache_hit = 0.30
input_cache_miss = 3.00
output = 15.00

[[users]]
name = "alice"
requests_per_minute = 60
budget_usd = 5.00
budget_period = "month"
"""


def _write_models(models: Path) -> None:
    missing = [name for name in _SPARSE if not (models / f"{name}.gguf").is_file()]
    if not missing:
        return
    from tests.support.sparse_models import DEEPSEEK_V2_LITE, LFM2_1_2B, LLAMA3_8B, QWEN3_30B_A3B, write_sparse_gguf

    models.mkdir(parents=True, exist_ok=True)
    for spec in (LLAMA3_8B, QWEN3_30B_A3B, DEEPSEEK_V2_LITE, LFM2_1_2B):
        if spec.name in missing:
            write_sparse_gguf(models / f"{spec.name}.gguf", spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, required=True, help="the tree whose tierlocal package runs")
    parser.add_argument("--out", type=Path, required=True, help="one file per invocation is written here (emptied first)")
    parser.add_argument("--gemma", required=True, help="the Gemma 3 270M GGUF")
    parser.add_argument("--models", type=Path, required=True, help="the sparse GGUFs (written when missing)")
    parser.add_argument("--state", type=Path, default=Path("/tmp/tierlocal-cli-snapshot"), help="fixed TIERLOCAL_HOME and scratch (emptied first)")
    parser.add_argument("--vulkan", help="a Vulkan llama-server: adds the cases on Mesa's software GPU")
    parser.add_argument("--only", help="run the cases whose name contains this")
    args = parser.parse_args()
    _write_models(args.models)
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.rmtree(args.state, ignore_errors=True)
    args.out.mkdir(parents=True)
    args.state.mkdir(parents=True)
    (args.state / "gateway.toml").write_text(_GATEWAY_CONFIG.format(state=args.state))
    base_env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TIERLOCAL_", "HF_", "OLLAMA_", "GGML_", "NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY"))
    }
    base_env.update(
        {
            "TIERLOCAL_HOME": str(args.state / "home"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HOME": str(args.state / "hf"),
            "PATH": "/usr/bin:/bin",
            "COLUMNS": "120",
        }
    )
    checkout = args.checkout.resolve()
    for name, argv, extra in cases(args.gemma, args.models.resolve(), args.state, args.vulkan):
        if args.only and args.only not in name:
            continue
        done = subprocess.run(
            [sys.executable, "-c", _BOOTSTRAP, *argv],
            capture_output=True,
            text=True,
            cwd=checkout,
            env={**base_env, **extra},
            timeout=300,
            check=False,
        )
        (args.out / f"{name}.txt").write_text(
            f"$ tierlocal {' '.join(argv)}\nexit: {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
        )
        print(f"{name}: exit {done.returncode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
