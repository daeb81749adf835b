"""The machine a plan is for: device types (pure, :mod:`.types`), what ``--gpu`` describes
(pure, :mod:`.override`), and the probes that detect this machine (NVML, AMD sysfs, Apple
unified memory, ``llama-server --list-devices``, psutil: :mod:`.detect`). Timing this
machine with the engine is :mod:`tierlocal.measure`'s."""
