"""Describe the machine a benchmark ran on: CPU model, cores, memory, Python, numpy."""

from __future__ import annotations

import os
import platform

import numpy as np

__all__ = ["describe"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return "? GiB"
    return f"{pages / 2**30:.0f} GiB"


def describe() -> str:
    """Return one line: CPU model, cores, memory, OS, Python and numpy versions.

    Returns
    -------
    str
        e.g. ``"AMD EPYC, 2 cores, 8 GiB RAM, Linux 6.1, Python 3.12.3, numpy 2.4.6"``.

    """
    return (
        f"{_cpu_model()}, {os.cpu_count()} cores, {_memory()} RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, numpy {np.__version__}"
    )
