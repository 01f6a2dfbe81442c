"""Describe the machine a benchmark ran on (cores, memory, CPU model, Python, torch)."""

from __future__ import annotations

import os
import platform


def describe() -> str:
    """One line: CPU model, cores, memory, OS, Python."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = "?"
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory} RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )
