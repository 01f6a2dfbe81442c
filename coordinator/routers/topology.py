"""``/topology``: the fleet's default topology and the graph it gives the live fleet.

A job created without ``topology`` inherits this setting (:mod:`coordinator.fleet_topology`);
a started job's own graph is ``GET /jobs/{job_id}/topology``.
"""

from __future__ import annotations

from fastapi import APIRouter

from coordinator import fleet_topology, validation
from coordinator.deps import NowDep, OperateDep, ReadDep, SessionDep, SettingsDep
from meshfl.contract import FleetTopology, TopologySetting

__all__ = ["router"]

router = APIRouter(prefix="/topology", tags=["topology"])


def _view(session: SessionDep, settings: SettingsDep, now: float) -> FleetTopology:
    setting, updated_at = fleet_topology.get_setting(session)
    devices = fleet_topology.live_active_devices(session, now, settings)
    return fleet_topology.preview(setting, updated_at, devices)


@router.get("", response_model=FleetTopology)
def get_topology(
    _: ReadDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> FleetTopology:
    """The default setting and its graph over the live, active devices: W and spectral gap."""
    return _view(session, settings, now)


@router.put("", response_model=FleetTopology)
def put_topology(
    body: TopologySetting, _: OperateDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> FleetTopology:
    """Set the fleet's default topology: a kind with parameters, or ``custom`` with a graph.

    422 for a value no job could use (the same rules as a job spec's topology fields).
    Jobs already created keep the topology they were created with.
    """
    validation.validate_topology_setting(body)
    fleet_topology.put_setting(session, body, now)
    return _view(session, settings, now)
