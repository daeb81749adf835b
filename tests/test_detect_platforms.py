"""Detection on machines this one is not: Apple silicon (sysctl), an AMD APU working from GTT
(Strix Halo), Intel Arc (xe / i915 sysfs) and DGX Spark (NVML without a memory figure). None of
these devices is here, so each probe is driven by what the real tools printed on one, recorded
in public issues (cited beside each), through the seam the probe reads from: sysctl's answers,
a sysfs tree laid out as the kernel writes it, NVML's Python binding answering as that driver
does. The one-pool rule and the merge with llama-server's own report are the product's code."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from tierlocal.engines.llama_server import parse_list_devices
from tierlocal.gpu_figures import gpu_speed_for
from tierlocal.hardware.apple import probe_apple
from tierlocal.hardware.detect import merge_engine_devices, one_pool, probe_amd_sysfs, probe_intel_sysfs, probe_nvml
from tierlocal.hardware.types import Device

GIB = 1024**3
MIB = 1024**2


def _sysctl(answers: dict[str, str]):  # type: ignore[no-untyped-def]
    return lambda name: answers.get(name)


def test_an_m5_max_with_the_default_wired_limit_is_one_pool() -> None:
    # osaurus-ai/osaurus#1958 (macOS 26, M5 Max 128 GB): iogpu.wired_limit_mb=0 (kernel default), hw.memsize=137438953472
    answers = {"machdep.cpu.brand_string": "Apple M5 Max", "hw.memsize": "137438953472", "iogpu.wired_limit_mb": "0"}
    (device,), probe = probe_apple(1, system="Darwin", machine="arm64", sysctl=_sysctl(answers))
    assert probe.status == "found" and "default" in probe.detail
    assert (device.name, device.backend, device.unified_pool_bytes) == ("Apple M5 Max", "metal", 128 * GIB)
    assert device.total_bytes == 96 * GIB  # 3/4 above 36 GB, as devices reported it before macOS 26
    assert device.bandwidth_bytes_per_s == 614 * 10**9
    speed = gpu_speed_for(device.name, device.bandwidth_bytes_per_s)
    assert speed is not None and speed.source == "derived"  # no published rows for the M5 Max: its generation's


def test_a_wired_limit_set_on_the_mac_is_the_gpus_share_and_the_engine_has_the_last_word() -> None:
    # Andyyyy64/whichllm#152: `sudo sysctl iogpu.wired_limit_mb=26000` on an M1 Max, then
    # `llama-server --list-devices` printed "MTL0: Apple M1 Max (26000 MiB, 25999 MiB free)".
    answers = {"machdep.cpu.brand_string": "Apple M1 Max", "hw.memsize": str(32 * GIB), "iogpu.wired_limit_mb": "26000"}
    (device,), probe = probe_apple(1, system="Darwin", machine="arm64", sysctl=_sysctl(answers))
    assert device.total_bytes == 26000 * MIB and "iogpu.wired_limit_mb = 26000" in probe.detail
    (listed,) = parse_list_devices("Available devices:\n  MTL0: Apple M1 Max (26000 MiB, 25999 MiB free)\n")
    engine = Device(f"{listed.name}: {listed.description}", "mtl", listed.total_bytes, listed.free_bytes, None, "llama-server:MTL0")
    (merged,) = merge_engine_devices([device], [engine])  # the same GPU, not a second one
    assert (merged.total_bytes, merged.free_bytes, merged.unified_pool_bytes) == (26000 * MIB, 25999 * MIB, 32 * GIB)
    # What is free now is split as the pool is: no byte is the GPU's and the host's.
    (gpu,), host = one_pool([merged], 20 * GIB)
    assert gpu.free_bytes == int(20 * GIB * 26000 * MIB / (32 * GIB)) and gpu.free_bytes + host == 20 * GIB


def test_the_first_m1_builds_named_no_chip_and_other_machines_have_no_apple_gpu() -> None:
    # archspec/archspec#38 (M1, November 2020): "machdep.cpu.brand_string: Apple processor"
    (device,), probe = probe_apple(16 * GIB, system="Darwin", machine="arm64", sysctl=_sysctl({"machdep.cpu.brand_string": "Apple processor"}))
    assert device.name == "Apple processor" and device.bandwidth_bytes_per_s is None and "not in recipes/gpus.toml" in probe.detail
    assert device.total_bytes == int(16 * GIB * 2 / 3) and device.unified_pool_bytes == 16 * GIB  # hw.memsize unread: this RAM
    assert probe_apple(16 * GIB, system="Linux", machine="x86_64")[0] == []
    assert probe_apple(16 * GIB, system="Darwin", machine="x86_64")[1].status == "absent"  # an Intel Mac


def _amd_card(root: Path, card: str, files: dict[str, str]) -> None:
    device = root / "class" / "drm" / card / "device"
    device.mkdir(parents=True)
    for name, text in {"vendor": "0x1002", **files}.items():
        (device / name).write_text(text + "\n")


def test_strix_halo_working_from_gtt_is_one_pool(tmp_path: Path) -> None:
    # ROCm/legacy-rocm-build#6004 (Beelink GTR9 Pro, 128 GB, BIOS UMA 512 MB, amdgpu.gttsize=131072):
    # mem_info_vram_total=536870912, mem_info_gtt_total=137438953472; the APU has no product_name
    # (SikamikanikoBG/homelab-monitor#254), its PCI id is 0x1586 (Andyyyy64/whichllm#154).
    _amd_card(
        tmp_path, "card1", {"device": "0x1586", "mem_info_vram_total": "536870912", "mem_info_vram_used": "0", "mem_info_gtt_total": "137438953472"}
    )
    (device,), probe = probe_amd_sysfs(tmp_path, ram_total_bytes=128 * GIB)
    assert (device.name, device.unified_pool_bytes) == ("Ryzen AI Max+ 395 (Strix Halo)", 128 * GIB)
    assert device.total_bytes == 96 * GIB  # GTT spans all RAM: planned at AMD's 96 of 128 GB, the host keeps the rest
    assert device.bandwidth_bytes_per_s == 256 * 10**9 and "planned at 75% of RAM" in probe.detail
    (gpu,), host = one_pool([device], 120 * GIB)
    assert (gpu.free_bytes, host) == (90 * GIB, 30 * GIB)


def test_strix_halo_with_gtt_raised_and_with_a_bios_carve_out(tmp_path: Path) -> None:
    # noamsto/nix-amd-ai#42 (Flow Z13 128 GB, ttm.pages_limit=25165824): gtt 103079215104, vram 4294967296
    _amd_card(tmp_path / "gtt", "card1", {"device": "0x1586", "mem_info_vram_total": "4294967296", "mem_info_gtt_total": "103079215104"})
    (device,), _ = probe_amd_sysfs(tmp_path / "gtt", ram_total_bytes=128 * GIB)
    assert device.total_bytes == 96 * GIB and device.unified_pool_bytes == 128 * GIB
    # ROCm/legacy-rocm-build#5444 (96 GB set in the BIOS): mem_info_vram_total 103079215104 — VRAM
    # the OS no longer counts as RAM, so a device of its own, not a share of the pool.
    _amd_card(tmp_path / "bios", "card0", {"device": "0x1586", "mem_info_vram_total": "103079215104", "mem_info_gtt_total": "16106127360"})
    (carved,), _ = probe_amd_sysfs(tmp_path / "bios", ram_total_bytes=32 * GIB)
    assert (carved.total_bytes, carved.unified_pool_bytes, carved.name) == (96 * GIB, 0, "Ryzen AI Max+ 395 (Strix Halo)")


def test_the_engine_sees_the_apu_under_its_own_name_and_it_is_one_device(tmp_path: Path) -> None:
    # GPUOpen-Drivers/AMDVLK#413: "using device Vulkan0 (Radeon 8060S Graphics (RADV GFX1151)) - 87722 MiB free"
    _amd_card(tmp_path, "card1", {"device": "0x1586", "mem_info_vram_total": "536870912", "mem_info_gtt_total": "103079215104"})
    (apu,), _ = probe_amd_sysfs(tmp_path, ram_total_bytes=128 * GIB)
    engine = Device("Vulkan0: Radeon 8060S Graphics (RADV GFX1151)", "vulkan", 88000 * MIB, 87722 * MIB, None, "llama-server:Vulkan0")
    (merged,) = merge_engine_devices([apu], [engine])
    assert merged.free_bytes == 87722 * MIB and merged.unified_pool_bytes == 128 * GIB


def _intel_card(root: Path, card: str, device_id: str, files: dict[str, str]) -> None:
    device = root / "class" / "drm" / card / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x8086\n")
    (device / "device").write_text(device_id + "\n")
    for name, text in files.items():
        (device / name).parent.mkdir(parents=True, exist_ok=True)
        (device / name).write_text(text + "\n")


def test_intel_arc_by_pci_id_with_or_without_a_vram_file(tmp_path: Path) -> None:
    # B580 (PCI id e20b, intel/media-driver#1917: "VRAM[0, 0]: Actual physical size 0x0000000300000000");
    # xe writes tile0/physical_vram_size_bytes with "%llu" (drivers/gpu/drm/xe/xe_tile_sysfs.c).
    _intel_card(tmp_path, "card1", "0xe20b", {"tile0/physical_vram_size_bytes": str(0x300000000)})
    # A770 (0x56a0, ggml-org/llama.cpp#28725) on mainline i915: no VRAM file; the integrated GPU
    # of the same machine (0x46a6, Alder Lake) is not an accelerator llama.cpp would plan on.
    _intel_card(tmp_path, "card2", "0x56a0", {})
    _intel_card(tmp_path, "card0", "0x46a6", {})
    devices, probe = probe_intel_sysfs(tmp_path)
    assert [(d.name, d.backend, d.total_bytes, d.bandwidth_bytes_per_s) for d in devices] == [
        ("Arc B580", "sycl", 12 * GIB, 456 * 10**9),
        ("Arc A770 16GB", "sycl", 16 * GIB, 560 * 10**9),
    ]
    assert "card2: the driver gives no VRAM size" in probe.detail
    assert probe_intel_sysfs(tmp_path / "none")[1].status == "absent"


def test_dgx_spark_whose_nvml_gives_no_memory_is_its_share_of_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    """GB10 (XuehaiPan/nvitop#208, driver 580.173.02): nvmlDeviceGetMemoryInfo → NVML_ERROR_NOT_SUPPORTED,
    MemTotal 127600748 kB. No NVIDIA driver is here: NVML's binding answers as that driver did."""
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: index)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: "NVIDIA GB10")

    def not_supported(handle: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", not_supported)
    pool = 127600748 * 1024
    (device,), probe = probe_nvml(pool)
    assert probe.status == "found" and (device.name, device.backend, device.unified_pool_bytes) == ("DGX Spark (GB10)", "cuda", pool)
    assert device.total_bytes == int(pool * 0.85) and device.bandwidth_bytes_per_s == 273 * 10**9
    speed = gpu_speed_for(device.name, device.bandwidth_bytes_per_s)
    assert speed is not None and speed.source == "published"  # llama-bench rows of its own
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: "NVIDIA H100 PCIe")
    assert probe_nvml(pool)[1].detail.startswith("NVML error")  # a discrete card without memory info stays an error
