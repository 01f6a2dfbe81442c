"""The fleet's default topology: the stored setting, jobs that inherit it, the live graph.

The setting (:class:`~meshfl.contract.TopologySetting`, the names of ``JobSpec``'s
topology fields) is one row of ``fleet_settings`` under :data:`SETTING_NAME`; without a
row the built-in :data:`DEFAULT_SETTING` (a ring, default parameters) is in force. A job
created without ``topology`` takes the setting's kind and those of its parameters the
spec does not set (:func:`fill_spec`), once, at creation: changing the setting later
never changes a created job. :func:`preview` builds the graph the setting gives the
devices a job could start on now, with :mod:`coordinator.planning` (the same builders,
W and spectral gap as a job's start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy.orm import Session

from coordinator import planning, store
from coordinator.db import Device, FleetSetting
from coordinator.settings import CoordinatorSettings
from meshfl.contract import (
    FleetTopology,
    JobSpec,
    TopologyEdge,
    TopologyNode,
    TopologySetting,
)
from meshfl.errors import ConfigError, TopologyError

__all__ = [
    "DEFAULT_SETTING",
    "PREVIEW_SEED",
    "SETTING_FIELDS",
    "SETTING_NAME",
    "fill_spec",
    "get_setting",
    "live_active_devices",
    "preview",
    "put_setting",
]

SETTING_NAME = "topology"
"""The ``fleet_settings`` row holding the default topology."""

DEFAULT_SETTING = TopologySetting(topology="ring")
"""In force until an operator sets one: a ring with Metropolis–Hastings weights."""

SETTING_FIELDS = (
    "topology",
    "topology_degree",
    "topology_probability",
    "topology_seed",
    "mixing",
    "custom_graph",
)
"""The ``JobSpec`` fields a topology setting carries (and a job inherits)."""

PREVIEW_SEED = 0
"""Seed of the random builders in :func:`preview` when the setting has no ``topology_seed``
(a job uses its own ``seed`` instead)."""


def get_setting(session: Session) -> tuple[TopologySetting, float | None]:
    """The fleet's default topology and when it was set (unix seconds; ``None``: built-in)."""
    row = session.get(FleetSetting, SETTING_NAME)
    if row is None:
        return TopologySetting(**DEFAULT_SETTING), None
    return cast(TopologySetting, dict(row.value)), float(row.updated_at)


def put_setting(session: Session, setting: TopologySetting, now: float) -> None:
    """Store ``setting`` (validated by the caller) as the fleet's default; commits."""
    value = {k: setting[k] for k in SETTING_FIELDS if k in setting}  # type: ignore[literal-required]
    row = session.get(FleetSetting, SETTING_NAME)
    if row is None:
        session.add(FleetSetting(name=SETTING_NAME, value=value, updated_at=now))
    else:
        row.value, row.updated_at = value, now
    session.commit()


def fill_spec(spec: JobSpec, setting: TopologySetting) -> JobSpec:
    """``spec`` with the fleet default filled in when it names no ``topology``.

    A spec that names its ``topology`` is returned unchanged (its absent parameters take
    the job defaults, as before). Otherwise the setting's kind and each setting parameter
    the spec does not set are copied in; the spec's own parameters win.
    """
    if "topology" in spec:
        return spec
    inherited = {k: setting[k] for k in SETTING_FIELDS if k in setting}  # type: ignore[literal-required]
    return cast(JobSpec, {**inherited, **spec})


def live_active_devices(
    session: Session, now: float, settings: CoordinatorSettings
) -> list[Device]:
    """Devices a job could start on now, ordered by name then id (their graph positions).

    Heard from within ``settings.live_within_s`` seconds, in state ``active`` and not
    inference-only; busy devices are included (the preview is the whole fleet's graph).
    """
    return sorted(
        (
            d
            for d in store.list_devices(session)
            if now - d.last_seen <= settings.live_within_s
            and d.state == "active"
            and (d.profile or {}).get("role") != "inference"
        ),
        key=lambda d: (d.name, d.id),
    )


def preview(
    setting: TopologySetting, updated_at: float | None, devices: Sequence[Device]
) -> FleetTopology:
    """The graph ``setting`` gives ``devices`` (node ``k`` is ``devices[k]``), W and gap.

    Built as a job starting on exactly these devices would build it
    (:func:`coordinator.planning.base_graph`, :func:`coordinator.planning.mixing`), with
    seed :data:`PREVIEW_SEED` unless the setting has ``topology_seed``. With no device, or
    when the kind cannot be built for this many (a torus of a prime, a custom graph of
    another size), ``error`` says why and the graph is empty; a disconnected graph is shown
    with its ``error`` (a job would not start on it) and spectral gap 0.
    """
    out = FleetTopology(
        setting=setting, updated_at=updated_at, nodes=[], edges=[], spectral_gap=None, error=None
    )
    if not devices:
        out["error"] = "no live, active device to build a graph on; start agents"
        return out
    spec: dict[str, Any] = {"seed": PREVIEW_SEED, **setting}
    try:
        graph = planning.base_graph(cast(JobSpec, spec), len(devices))
        w, gap = planning.mixing(graph, cast(JobSpec, spec))
    except (ConfigError, TopologyError) as exc:
        kind, n = setting["topology"], len(devices)
        out["error"] = f"topology {kind!r} cannot be built for {n} devices: {exc}"
        return out
    out["nodes"] = [
        TopologyNode(device_id=d.id, name=d.name, self_weight=w[k][k])
        for k, d in enumerate(devices)
    ]
    out["edges"] = [
        TopologyEdge(source=devices[i].id, target=devices[j].id, weight=w[i][j])
        for i, j in planning.edge_list(graph)
    ]
    out["spectral_gap"] = gap
    if not graph.is_connected():
        out["error"] = (
            f"the graph is disconnected on {len(devices)} devices: a job would not start;"
            " raise topology_degree or topology_probability"
        )
    return out
