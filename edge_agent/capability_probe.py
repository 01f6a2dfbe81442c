"""The capability profile a device reports to the coordinator (``PUT .../profile``).

The planner uses it to give slow devices fewer local steps or smaller batches; the
throughput figure is measured on the job's own model and batch size. The battery figures
come from :func:`battery_status`; the link figures (RTT and throughput to the broker) from
:func:`edge_agent.link_probe.measure_link`, added by the job runner once it is connected.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import psutil

from edge_agent.trainer import Trainer, accelerator_name
from meshfl.contract import CapabilityProfile

__all__ = ["battery_status", "capability_profile"]


def battery_status() -> tuple[float | None, bool | None]:
    """Return ``(percent, charging)`` of this device's battery, or ``(None, None)``.

    ``percent`` is 0-100; ``charging`` is True while on external power (psutil's
    ``power_plugged``: plugged in, possibly full), None when the OS does not say. Machines
    without a battery, and platforms where psutil cannot read one, give ``(None, None)``.
    """
    try:
        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        return None, None
    if battery is None:
        return None, None
    percent = None if battery.percent is None else float(battery.percent)
    plugged = battery.power_plugged
    return percent, None if plugged is None else bool(plugged)


def capability_profile(
    trainer: Trainer | None, x: np.ndarray | None = None, y: np.ndarray | None = None
) -> CapabilityProfile:
    """Measure this device.

    Parameters
    ----------
    trainer : Trainer or None
        The job's trainer. When given (with x and y), ``train_samples_per_s`` is measured
        with :meth:`Trainer.measure_throughput` (parameters left unchanged; a trainer
        with a ``slowdown`` measures the slowed device) and ``model_hash`` is its
        ``spec_hash``; when None, both are left out.
    x, y : numpy.ndarray, optional
        Local training data, (n, input_dim) float32 and (n,) int64.

    Returns
    -------
    CapabilityProfile
        ``cores`` (``os.cpu_count()``, logical), ``memory_bytes`` (total RAM),
        ``accelerator`` (``"cuda:<name>"`` or None), ``platform``
        (``platform.platform()``), ``battery_percent`` and ``charging``
        (:func:`battery_status`; None without a battery), ``measured_at`` (unix seconds),
        and the trainer-derived fields above.

    Raises
    ------
    DataError
        ``x``/``y`` do not fit the trainer's model, or are empty.

    """
    profile: CapabilityProfile = {
        "cores": os.cpu_count() or 1,
        "memory_bytes": int(psutil.virtual_memory().total),
        "accelerator": accelerator_name(),
        "platform": platform.platform(),
    }
    profile["battery_percent"], profile["charging"] = battery_status()
    if trainer is not None:
        profile["model_hash"] = trainer.spec_hash
        if x is not None and y is not None:
            profile["train_samples_per_s"] = trainer.measure_throughput(x, y)
            profile["train_samples"] = len(x)
    profile["measured_at"] = time.time()
    return profile
