"""Hardware detection on this machine (no GPU), through the real Vulkan llama-server on Mesa's
software device, through AMD's sysfs format, and ``--gpu`` overrides."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tierlocal.errors import HardwareError, UsageError
from tierlocal.hardware.detect import detect, probe_amd_sysfs, probe_nvml
from tierlocal.hardware.override import parse_gpu_override

_GIB = 1024**3


def _meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_hw_on_this_machine_reports_no_gpu_ram_and_disk(tmp_path: Path) -> None:
    result = run_cli("hw", "--json", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["gpus"] == []
    assert payload["ram_total_bytes"] == _meminfo_total_bytes()
    assert 0 < payload["ram_available_bytes"] <= payload["ram_total_bytes"]
    assert payload["cpu_threads"] == os.cpu_count()
    statvfs = os.statvfs("/")
    assert payload["disk_path"] == str(Path(os.environ["TIERLOCAL_HOME"]) / "models")
    assert abs(payload["disk_free_bytes"] - statvfs.f_bavail * statvfs.f_frsize) < 512 * 1024 * 1024
    probes = {probe["name"]: probe for probe in payload["probes"]}
    assert probes["nvml"]["status"] == "absent"
    assert probes["amd-sysfs"]["status"] == "absent"
    assert probes["llama-server"]["status"] == "absent"
    human = run_cli("hw", env={"PATH": "/usr/bin:/bin"})
    assert "accelerators: none" in human.stdout
    assert "system RAM:" in human.stdout


def test_hw_sees_the_vulkan_device_through_llama_server(assets: Assets) -> None:
    env = {"TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_vulkan), "GGML_VK_VISIBLE_DEVICES": "0"}
    direct = subprocess.run(
        [str(assets.llama_server_vulkan), "--list-devices"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
        timeout=60,
    )
    match = re.search(r"^\s+(Vulkan0): (.*) \((\d+) MiB, (\d+) MiB free\)$", direct.stdout, re.MULTILINE)
    assert match, direct.stdout
    result = run_cli("hw", "--json", env=env)
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    assert len(gpus) == 1
    gpu = gpus[0]
    assert gpu["backend"] == "vulkan"
    assert gpu["name"] == f"Vulkan0: {match.group(2)}"
    assert "llvmpipe" in gpu["name"]
    assert gpu["total_bytes"] == int(match.group(3)) * 1024 * 1024
    assert gpu["free_bytes"] == int(match.group(4)) * 1024 * 1024
    assert gpu["source"] == "llama-server:Vulkan0"


def test_cpu_build_lists_no_devices(assets: Assets) -> None:
    result = run_cli("hw", "--json", env={"TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_cpu)})
    payload = json.loads(result.stdout)
    assert payload["gpus"] == []
    assert [p["status"] for p in payload["probes"] if p["name"] == "llama-server"] == ["absent"]


def test_amd_sysfs_format(tmp_path: Path) -> None:
    """The amdgpu driver cannot run here; its sysfs files can be laid out as the kernel does."""
    card = tmp_path / "class" / "drm" / "card1" / "device"
    card.mkdir(parents=True)
    (card / "vendor").write_text("0x1002\n")
    (card / "mem_info_vram_total").write_text(f"{24 * _GIB}\n")
    (card / "mem_info_vram_used").write_text(f"{2 * _GIB}\n")
    (card / "product_name").write_text("AMD Radeon RX 7900 XTX\n")
    other = tmp_path / "class" / "drm" / "card0" / "device"
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    (tmp_path / "class" / "drm" / "card1-DP-1").mkdir()
    devices, probe = probe_amd_sysfs(tmp_path)
    assert probe.status == "found"
    assert [(d.name, d.backend, d.total_bytes, d.free_bytes) for d in devices] == [("AMD Radeon RX 7900 XTX", "rocm", 24 * _GIB, 22 * _GIB)]
    assert devices[0].bandwidth_bytes_per_s == 960 * 10**9


def test_detect_merges_vendor_probes_and_reports_absence() -> None:
    hardware = detect(vendor_probes=[probe_nvml])
    assert [probe.name for probe in hardware.probes] == ["nvml", "apple", "llama-server", "cpu"]
    assert all(probe.status == "absent" for probe in hardware.probes[:-1])
    assert hardware.probes[-1].detail.endswith("(from /proc/cpuinfo; the build may use fewer)")  # no engine to ask


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["24GiB"], [("24GiB GPU", 24 * _GIB)]),
        (["24GB"], [("24GB GPU", 24 * 10**9)]),
        (["24000MiB"], [("24000MiB GPU", 24000 * 1024**2)]),
        (["RTX 4090"], [("RTX 4090", 24 * _GIB)]),
        (["2xH100"], [("H100 #0", 80 * _GIB), ("H100 #1", 80 * _GIB)]),
        (["h200", "2 x 16GiB"], [("H200", 141 * _GIB), ("16GiB GPU #0", 16 * _GIB), ("16GiB GPU #1", 16 * _GIB)]),
    ],
)
def test_gpu_override(values: list[str], expected: list[tuple[str, int]]) -> None:
    assert [(device.name, device.total_bytes) for device in parse_gpu_override(values)] == expected


@pytest.mark.parametrize("name", ["rtx-4090", "rtx4090", "RTX_4090", "GeForce RTX 4090", "4090"])
def test_named_gpu_override_carries_backend_and_bandwidth(name: str) -> None:
    (device,) = parse_gpu_override([name])
    assert (device.name, device.backend, device.bandwidth_bytes_per_s) == ("RTX 4090", "cuda", 1008 * 10**9)


@pytest.mark.parametrize("value", ["Voodoo 5", "0GiB", "0xH100", "5000xH100", "-3GB", "24"])
def test_bad_gpu_override(value: str) -> None:
    with pytest.raises((HardwareError, UsageError)) as caught:
        parse_gpu_override([value])
    assert caught.value.exit_code == 2 and (caught.value.hint or "0xH100" in value or "5000" in value)


def test_a_misspelt_gpu_gets_the_nearest_names() -> None:
    with pytest.raises(HardwareError) as caught:
        parse_gpu_override(["rtx 4009"])
    assert str(caught.value) == "--gpu 'rtx 4009' is neither a size nor a GPU we know (did you mean RTX 4090, RTX 4080 or RTX 4070?)"


def test_bad_gpu_override_on_the_command_line() -> None:
    result = run_cli("hw", "--gpu", "Voodoo 5")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: --gpu 'Voodoo 5' is neither a size nor a GPU we know"
    assert lines[1].startswith("hint: give a size (24GiB), one of the ") and "(M3 Max 64GB), or none" in lines[1]
    bare = run_cli("check", "--ram", "16")
    assert (bare.returncode, bare.stderr.splitlines()) == (2, ["error: --ram '16' has no unit", "hint: write 16GiB (binary) or 16GB (decimal)"])
    override = json.loads(run_cli("hw", "--gpu", "2xH100", "--json").stdout)
    assert override["overridden"] is True
    assert [gpu["name"] for gpu in override["gpus"]] == ["H100 #0", "H100 #1"]


@pytest.mark.parametrize(
    ("value", "gpu", "gpu_gib", "host_gib"),
    [
        # Apple's Metal working set as devices report it: 2/3 of RAM up to 36 GB, 3/4 above.
        ("M3 Max 64GB", "Apple M3 Max 64GB (unified)", 48, 16),
        ("apple m1 16gb", "Apple M1 16GB (unified)", 16 * 2 / 3, 16 / 3),
        # AMD's Variable Graphics Memory: up to 96 GB of 128 GB.
        ("Ryzen AI Max+ 395 128GB", "Ryzen AI Max+ 395 (Strix Halo) 128GB (unified)", 96, 32),
    ],
)
def test_a_unified_memory_machine_is_one_pool_counted_once(value: str, gpu: str, gpu_gib: float, host_gib: float) -> None:
    """The GPU gets its default share of the pool and the host the rest, both at the pool's
    bandwidth: the same bytes are never RAM and VRAM at once."""
    payload = json.loads(run_cli("hw", "--gpu", value, "--json").stdout)
    (device,) = payload["gpus"]
    assert device["name"] == gpu and device["total_bytes"] == pytest.approx(gpu_gib * _GIB, abs=1)
    assert payload["ram_available_bytes"] == pytest.approx(host_gib * _GIB, abs=1)
    assert device["total_bytes"] + payload["ram_available_bytes"] == payload["ram_total_bytes"]
    assert payload["ram_bandwidth_bytes_per_s"] == device["bandwidth_bytes_per_s"]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--gpu", "M3 Max"], "error: --gpu 'M3 Max': how much RAM has it?"),
        (["--gpu", "M1 24GB"], "error: --gpu 'M1 24GB': the Apple M1 is not sold with 24 GB"),
        (
            ["--gpu", "M3 Max 64GB", "--ram", "32GiB"],
            "error: --gpu 'Apple M3 Max 64GB' already gives the machine's memory: one pool for its GPU and CPU",
        ),
    ],
)
def test_a_unified_machine_needs_its_ram_once(argv: list[str], error: str) -> None:
    result = run_cli("check", *argv)
    assert result.returncode == 2 and result.stderr.splitlines()[0] == error


def test_gpu_none_plans_a_cpu_only_machine_from_anywhere() -> None:
    payload = json.loads(run_cli("check", "--gpu", "none", "--ram", "16GiB", "--json").stdout)
    assert payload["hardware"]["gpus"] == [] and payload["recommendation"]["where"] == "CPU"


@pytest.mark.parametrize(
    "name", ["RTX 4060", "RTX 3060 12GB", "RTX 3080", "RTX 4070 Ti", "RX 9070 XT", "Arc B580", "V100 32GB", "A10", "RTX PRO 6000"]
)
def test_the_cards_people_own_are_known_by_name(name: str) -> None:
    (device,) = parse_gpu_override([name])
    assert device.total_bytes >= 8 * _GIB and device.bandwidth_bytes_per_s
