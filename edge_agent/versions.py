"""A device's view of its job's topology versions: its row of W, round by round.

The coordinator plans version 1 at the job's start and a new version whenever a device
joins, leaves or dies (``issues show 4``, churn). Each version comes in force at its
``from_round``; agents learn it from the retained control-topic message or from their
assignment (polled over REST after every round), whichever comes first, and switch at
the start of that round. ``one-peer-exponential`` is time-varying inside a version:
round ``r`` uses :func:`meshfl.topology.one_peer_exponential` ``(n, r)`` with
Metropolis–Hastings (or max-degree) weights, and the device listens to the union of
its rounds' neighbours, the exponential graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshfl.contract import Assignment, spec_value
from meshfl.errors import TopologyError
from meshfl.topology import Graph, mixing_matrix, one_peer_exponential
from meshfl.wire.control import ControlMessage

__all__ = ["TopologyVersion"]


@dataclass(frozen=True)
class TopologyVersion:
    """One topology version as this device sees it.

    ``position`` is the device's row in W (-1: it is no longer part of the job);
    ``neighbours`` maps each neighbour id to w_ij; ``self_weight`` is w_ii.
    """

    version: int
    from_round: int
    kind: str
    mixing: str
    devices: tuple[str, ...]
    position: int
    neighbours: Mapping[str, float]
    self_weight: float

    @classmethod
    def from_assignment(cls, assignment: Assignment) -> TopologyVersion:
        """The version carried by a REST assignment."""
        spec = assignment["spec"]
        return cls(
            version=int(assignment["topology_version"]),
            from_round=int(assignment["from_round"]),
            kind=spec["topology"],
            mixing=spec_value(spec, "mixing"),
            devices=tuple(assignment["devices"]),
            position=int(assignment["position"]),
            neighbours={n["device_id"]: float(n["weight"]) for n in assignment["neighbours"]},
            self_weight=float(assignment["self_weight"]),
        )

    @classmethod
    def from_control(
        cls, message: ControlMessage, device_id: str, mixing: str
    ) -> TopologyVersion | None:
        """The version of a decoded control message, or ``None`` if its graph is invalid.

        The message (:func:`meshfl.wire.control.decode_control`, which checked its
        fields) carries the graph (``devices``, ``edges``), not W: this device's row is
        row ``position`` of :func:`meshfl.topology.mixing_matrix` under ``mixing``, the
        same function and inputs the coordinator used, so the weights are identical to
        the assignment's.
        """
        devices = message.devices
        position = devices.index(device_id) if device_id in devices else -1
        neighbours: dict[str, float] = {}
        self_weight = 1.0
        if position >= 0:
            try:
                graph = Graph(len(devices), frozenset(message.edges))
                row = mixing_matrix(graph, mixing)[position]
            except TopologyError:
                return None
            neighbours = {devices[j]: float(row[j]) for j in graph.neighbours(position)}
            self_weight = float(row[position])
        return cls(
            version=message.version,
            from_round=message.from_round,
            kind=str(message.kind),
            mixing=mixing,
            devices=devices,
            position=position,
            neighbours=neighbours,
            self_weight=self_weight,
        )

    @property
    def removed(self) -> bool:
        """Whether this device is no longer part of the job in this version."""
        return self.position < 0

    def peers(self) -> set[str]:
        """The devices to listen to during this version (all rounds' neighbours)."""
        return set(self.neighbours)

    def row(self, round_: int) -> tuple[dict[str, float], float]:
        """Return this device's ``(neighbour weights, self weight)`` at ``round_``."""
        if self.kind != "one-peer-exponential" or self.removed:
            return dict(self.neighbours), self.self_weight
        graph = one_peer_exponential(len(self.devices), round_)
        w = mixing_matrix(graph, self.mixing)
        i = self.position
        weights = {self.devices[j]: float(w[i, j]) for j in graph.neighbours(i)}
        return weights, float(w[i, i])
