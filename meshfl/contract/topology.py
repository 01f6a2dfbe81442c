"""Topology: the fleet's default graph (``/topology``) and a job's graph and plan."""

from __future__ import annotations

from typing import Literal

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request

__all__ = [
    "CustomGraph",
    "DevicePlan",
    "FleetTopology",
    "Neighbour",
    "TopologyEdge",
    "TopologyEvent",
    "TopologyEventKind",
    "TopologyNode",
    "TopologyPublic",
    "TopologySetting",
]

TopologyEventKind = Literal["start", "join", "leave"]


@strict_request
class CustomGraph(TypedDict):
    """An uploaded graph: ``n`` nodes ``0..n-1`` and undirected ``edges`` ``[i, j]``."""

    n: int
    edges: list[list[int]]  # pairs [i, j] (JSON arrays)


@strict_request
class TopologySetting(TypedDict):
    """The fleet's default topology (``PUT /topology``); the names are ``JobSpec``'s.

    Absent parameters take the job defaults (degree 4, probability 0.3, the job's seed —
    0 in the fleet preview —, Metropolis–Hastings). ``custom_graph`` is required with
    ``topology`` ``custom`` and refused otherwise.
    """

    topology: str
    topology_degree: NotRequired[int]
    topology_probability: NotRequired[float]
    topology_seed: NotRequired[int]
    mixing: NotRequired[Literal["metropolis-hastings", "max-degree"]]
    custom_graph: NotRequired[CustomGraph]


@strict
class TopologyNode(TypedDict):
    """A device in the fleet graph and its self weight w_ii."""

    device_id: str
    name: str
    self_weight: float


@strict
class TopologyEdge(TypedDict):
    """An undirected edge of the fleet graph and its mixing weight w_ij (= w_ji)."""

    source: str  # device id
    target: str  # device id
    weight: float


@strict
class FleetTopology(TypedDict):
    """``GET /topology``: the default setting and the graph it gives the fleet now.

    The graph is built over the live (heard from within ``live_within_s``), ``active``
    devices ordered by name then id, as a job starting on all of them would get it;
    ``spectral_gap`` is 1 − |λ₂(W)|. ``error`` says why no graph could be built for that
    many devices (``nodes`` and ``edges`` are then empty and ``spectral_gap`` ``None``), or
    that the graph is disconnected (shown, with its gap 0: a job would not start on it).
    ``updated_at`` is ``None`` while the built-in default (a ring) is in force.
    """

    setting: TopologySetting
    updated_at: float | None  # unix seconds, coordinator clock
    nodes: list[TopologyNode]
    edges: list[TopologyEdge]
    spectral_gap: float | None
    error: str | None


@strict
class DevicePlan(TypedDict):
    """What the planner gave one device (all devices get one; defaults without ``plan``).

    ``work_fraction`` in (0, 1] scales the local work of a round (local steps =
    max(1, round(work_fraction · steps of ``local_epochs`` epochs))); ``byte_budget``
    (bytes per message, 0: none) caps a top-k/random-k codec's density for this device;
    ``no_wait`` (absent: none) lists neighbours behind slow links whose latest state the
    device mixes (within ``staleness`` rounds) without waiting for it.
    """

    work_fraction: float
    byte_budget: int
    no_wait: NotRequired[list[str]]  # slow-link neighbours a sync round does not wait for


@strict
class TopologyEvent(TypedDict):
    """One change of a running job's topology: a new version from ``from_round`` on."""

    version: int
    from_round: int
    kind: TopologyEventKind
    device_id: str | None  # the device that joined or left (None for "start")
    reason: str  # "started", "joined", "silent for 15 s", "battery 12% < 20%", ...
    at: float  # unix seconds, coordinator clock


@strict
class Neighbour(TypedDict):
    """One neighbour of a device and its mixing weight w_ij."""

    device_id: str
    weight: float


@strict
class TopologyPublic(TypedDict):
    """The job's current graph: edges, the mixing matrix W (row-major, by position).

    ``version`` counts changes (1 at start); it is in force from round ``from_round``;
    ``events`` lists every change so far, oldest first. For ``one-peer-exponential`` the
    edges and W are the union graph's (each round uses one of its matchings).
    """

    kind: str
    devices: list[str]
    edges: list[tuple[int, int]]
    mixing_matrix: list[list[float]]
    spectral_gap: float
    version: int
    from_round: int
    events: list[TopologyEvent]
