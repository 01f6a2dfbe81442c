"""Plan a job's topology: who takes part, who talks to whom, how much each device does.

The stored topology (``jobs.topology``, one JSON document, the *current version*) is::

    {"kind": "ring", "params": {"degree", "probability", "seed", "mixing"},
     "devices": [device ids by position in W], "edges": [[i, j], …],
     "gap": 1 − |λ₂(W)|, "version": 1, "from_round": 1, "events": [TopologyEvent, …],
     "plan": {device_id: DevicePlan}, "sit_out": {device_id: reason}}

The graph is :func:`meshfl.topology.build_graph` with the spec's parameters, or the
spec's ``custom_graph``; for ``one-peer-exponential`` the stored graph is the union
:func:`meshfl.topology.exponential` ``(n)`` (agents derive each round's matching from
``devices``). With ``spec.plan`` the devices' latest capability profiles go through
:func:`meshfl.planning.plan_devices` (work fraction by measured speed, OmniLearn, Tyagi
& Sharma 2025; a byte budget by measured uplink) and the graph through
:func:`meshfl.planning.link_aware_graph` (slow links get fewer edges, after Sun, Nguyen &
He 2025). W is :func:`meshfl.topology.mixing_matrix` under ``spec.mixing``
(Metropolis–Hastings by default, Xiao & Boyd 2004). W is not stored: :func:`weights`
derives it from the edges when asked, as agents do from a control message, so reading a
job at every assignment poll does not decode an N × N matrix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from coordinator.db import Device
from meshfl.contract import DevicePlan, JobSpec, spec_value
from meshfl.errors import ConfigError
from meshfl.modelspec import is_custom, layout, parameter_count
from meshfl.planning import battery_sit_out, link_aware_graph, no_wait, plan_devices
from meshfl.topology import (
    Graph,
    build_graph,
    exponential,
    from_edge_list,
    mixing_matrix,
    spectral_gap,
)

__all__ = [
    "DEFAULT_PLAN",
    "UNKNOWN_MODEL_BYTES",
    "base_graph",
    "battery_reasons",
    "custom_graph",
    "dense_bytes",
    "device_plans",
    "edge_list",
    "graph_for",
    "graph_of",
    "link_aware",
    "mixing",
    "selector_text",
    "selects",
    "topology_params",
    "uplinks",
    "with_no_wait",
]

DEFAULT_PLAN = DevicePlan(work_fraction=1.0, byte_budget=0)
"""The plan of every device of a job without ``spec.plan``: all the work, no byte budget."""

UNKNOWN_MODEL_BYTES = 2**31
"""Dense message size assumed for a custom model (bytes): every budget binds."""

PLAN_ROUND_FLOOR_S = 0.1
"""Seconds of a round the planner assumes go to communication (MQTT round trips, the
consensus step, evaluation): local training shorter than this is never cut."""


def topology_params(spec: JobSpec) -> dict[str, Any]:
    """The graph parameters of ``spec`` with their defaults filled in.

    ``degree`` 4, ``probability`` 0.3, ``seed`` ``spec.seed``, ``mixing``
    ``metropolis-hastings``.
    """
    return {
        "degree": int(spec_value(spec, "topology_degree")),
        "probability": float(spec_value(spec, "topology_probability")),
        "seed": int(spec.get("topology_seed", spec["seed"])),
        "mixing": str(spec_value(spec, "mixing")),
    }


def base_graph(spec: JobSpec, n: int) -> Graph:
    """The job's graph on ``n`` devices before planning.

    Raises
    ------
    meshfl.errors.ConfigError
        The kind cannot be built for ``n`` devices with these parameters, or the custom
        graph does not have ``n`` nodes.
    meshfl.errors.TopologyError
        A builder produced an invalid graph.

    """
    kind, params = spec["topology"], topology_params(spec)
    if kind == "custom":
        graph = custom_graph(spec)
        if graph.n != n:
            raise ConfigError(f"the custom graph has {graph.n} nodes but {n} devices take part")
        return graph
    if kind == "one-peer-exponential":
        return exponential(n)  # the union of the rounds' matchings
    return build_graph(
        kind, n, degree=params["degree"], probability=params["probability"], seed=params["seed"]
    )


def custom_graph(spec: JobSpec) -> Graph:
    """The spec's ``custom_graph`` as a :class:`Graph` (raises ConfigError when invalid)."""
    document: dict[str, Any] = dict(spec["custom_graph"])
    return from_edge_list(document)


def link_aware(spec: JobSpec) -> bool:
    """Whether planning reshapes the graph: ``spec.plan``, not one-peer or custom."""
    return bool(spec.get("plan")) and spec["topology"] not in ("one-peer-exponential", "custom")


def dense_bytes(spec: JobSpec) -> int:
    """Bytes of one dense fp32 message of the job's model (the planner's reference size).

    A zoo model: 4 bytes × its parameter count, from the layout the spec alone gives
    (:func:`meshfl.modelspec.layout`; ``mlp``: Σ (in + 1) · out over ``input_dim →
    hidden… → num_classes``); a custom model or an invalid spec:
    :data:`UNKNOWN_MODEL_BYTES`.
    """
    model = spec["model"]
    if is_custom(model):
        return UNKNOWN_MODEL_BYTES
    try:
        return 4 * parameter_count(layout(model))
    except ConfigError:
        return UNKNOWN_MODEL_BYTES


def _measured(profile: Mapping[str, Any], field: str) -> float | None:
    value = profile.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _charging(profile: Mapping[str, Any]) -> bool | None:
    value = profile.get("charging")
    return value if isinstance(value, bool) else None


def uplinks(devices: Sequence[Device]) -> list[float | None]:
    """Each device's latest measured uplink (bytes/s), ``None`` where unmeasured."""
    return [_measured(d.profile or {}, "uplink_bytes_per_s") for d in devices]


_SELECTOR_MINIMUMS = (
    ("min_cores", "cores"),
    ("min_memory_bytes", "memory_bytes"),
    ("min_train_samples_per_s", "train_samples_per_s"),
    ("min_uplink_bytes_per_s", "uplink_bytes_per_s"),
)


def selects(selector: Mapping[str, Any], device: Device) -> bool:
    """Whether ``device`` matches a job's :class:`~meshfl.contract.DeviceSelector`.

    The device carries every tag of ``selector["tags"]`` and its latest profile reports at
    least each ``min_*`` given (``min_cores`` against ``cores``, ``min_memory_bytes``
    against ``memory_bytes``, …; a field not reported does not match). An empty selector
    matches every device; the caller checks the device's ``state``.
    """
    if not set(selector.get("tags", ())) <= set(device.tags or ()):
        return False
    profile = device.profile or {}
    for least_key, field in _SELECTOR_MINIMUMS:
        least = selector.get(least_key)
        if least is None:
            continue
        value = _measured(profile, field)
        if value is None or value < float(least):
            return False
    return True


def selector_text(selector: Mapping[str, Any]) -> str:
    """The selector as operators wrote it, for messages: ``tags [gpu, lab], min_cores 4``."""
    parts = [f"tags [{', '.join(selector['tags'])}]"] if selector.get("tags") else []
    parts += [f"{key} {selector[key]:g}" for key, _ in _SELECTOR_MINIMUMS if key in selector]
    return ", ".join(parts) or "any device"


def battery_reasons(devices: Sequence[Device], min_battery_percent: float) -> dict[str, str]:
    """Devices that must sit out to save their battery: ``{device_id: reason}``.

    Below ``min_battery_percent`` (0: off) and not charging, by the latest profile
    (:func:`meshfl.planning.battery_sit_out`); a device without a battery never sits out.
    """
    if not min_battery_percent:
        return {}
    levels = [_measured(d.profile or {}, "battery_percent") for d in devices]
    found = battery_sit_out(
        levels, [_charging(d.profile or {}) for d in devices], min_battery_percent
    )
    return {devices[i].id: reason for i, reason in found.items()}


def device_plans(spec: JobSpec, devices: Sequence[Device]) -> dict[str, DevicePlan]:
    """Each device's :class:`DevicePlan`: planned from its profile with ``spec.plan``.

    Without ``spec.plan`` every device gets :data:`DEFAULT_PLAN`. With it,
    :func:`meshfl.planning.plan_devices` over ``devices`` (median-relative work
    fractions, byte budgets of ``uplink · uplink_budget_s`` against :func:`dense_bytes`).
    A device the planner sits out (battery) keeps the default plan: the callers filter
    battery first.
    """
    plans = {d.id: DevicePlan(**DEFAULT_PLAN) for d in devices}
    if not spec.get("plan") or not devices:
        return plans
    profiles = [d.profile or {} for d in devices]
    epochs = int(spec.get("local_epochs", 1))
    samples = [_measured(p, "train_samples") for p in profiles]
    plan = plan_devices(
        [_measured(p, "train_samples_per_s") for p in profiles],
        uplinks(devices),
        [_measured(p, "battery_percent") for p in profiles],
        [_charging(p) for p in profiles],
        budget_s=float(spec_value(spec, "uplink_budget_s")),
        dense_bytes=dense_bytes(spec),
        min_battery_percent=float(spec_value(spec, "min_battery_percent")),
        work_samples=[None if n is None else epochs * n for n in samples],
        round_floor_s=PLAN_ROUND_FLOOR_S,
    )
    for k, i in enumerate(plan.participants):
        plans[devices[i].id] = DevicePlan(
            work_fraction=float(plan.work_fraction[k]), byte_budget=int(plan.byte_budget[k])
        )
    return plans


def with_no_wait(
    spec: JobSpec, plans: Mapping[str, DevicePlan], graph: Graph, devices: Sequence[Device]
) -> dict[str, DevicePlan]:
    """``plans`` with each device's ``no_wait``: the slow-link neighbours it mixes late.

    Only for link-aware plans (:func:`link_aware`); ``graph`` is positioned like
    ``devices``. See :func:`meshfl.planning.no_wait`.
    """
    out = {
        d: DevicePlan(work_fraction=p["work_fraction"], byte_budget=p["byte_budget"])
        for d, p in plans.items()
    }
    if not link_aware(spec):
        return out
    for i, skip in no_wait(graph, uplinks(devices)).items():
        plan = out.setdefault(devices[i].id, DevicePlan(**DEFAULT_PLAN))
        plan["no_wait"] = sorted(devices[j].id for j in skip)
    return out


def mixing(graph: Graph, spec: JobSpec) -> tuple[list[list[float]], float]:
    """W of ``graph`` under ``spec.mixing`` (as nested lists) and its spectral gap."""
    w = mixing_matrix(graph, topology_params(spec)["mixing"])
    return [[float(x) for x in row] for row in w], float(spectral_gap(np.asarray(w)))


def graph_of(topology: Mapping[str, Any]) -> Graph:
    """The stored topology's current graph."""
    edges = frozenset((min(int(i), int(j)), max(int(i), int(j))) for i, j in topology["edges"])
    return Graph(len(topology["devices"]), edges)


def weights(topology: Mapping[str, Any]) -> np.ndarray:
    """W of the stored topology: float64, shape (n, n), n = ``len(topology["devices"])``.

    :func:`meshfl.topology.mixing_matrix` of :func:`graph_of` under the stored
    ``params.mixing`` (Metropolis–Hastings when absent); equal to the W computed when
    the version was planned, since the inputs are the same.
    """
    rule = str(spec_value(topology.get("params", {}), "mixing"))
    return mixing_matrix(graph_of(topology), rule)


def edge_list(graph: Graph) -> list[list[int]]:
    """``graph``'s edges as sorted ``[i, j]`` pairs, for JSON."""
    return sorted([int(i), int(j)] for i, j in graph.edges)


def graph_for(spec: JobSpec, graph: Graph, devices: Sequence[Device]) -> Graph:
    """``graph`` after link-aware planning where it applies (:func:`link_aware`)."""
    return link_aware_graph(graph, uplinks(devices)) if link_aware(spec) else graph
