"""A device's topology version from the control topic: its row of W from the edges."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edge_agent.versions import TopologyVersion
from meshfl.errors import PayloadError
from meshfl.topology import build_graph, mixing_matrix
from meshfl.wire.control import ControlMessage, decode_control

DEVICES = [f"device-{k:03d}" for k in range(64)]


def _body(edges: list[list[int]], **overrides: Any) -> dict[str, Any]:
    message = {"job": "job-1", "version": 2, "from_round": 5, "kind": "random-regular",
               "devices": DEVICES, "edges": edges, "status": "running"}  # fmt: skip
    return {**message, **overrides}


def _message(edges: list[list[int]], **overrides: Any) -> ControlMessage:
    return decode_control(json.dumps(_body(edges, **overrides)).encode())


@pytest.mark.parametrize("mixing", ["metropolis-hastings", "max-degree"])
def test_every_devices_row_equals_the_row_of_the_coordinators_w(mixing: str) -> None:
    graph = build_graph("random-regular", 64, degree=4, seed=3)
    w = mixing_matrix(graph, mixing)
    wire = _message(sorted([i, j] for i, j in graph.edges))

    for i, device in enumerate(DEVICES):
        version = TopologyVersion.from_control(wire, device, mixing)
        assert version is not None and version.position == i
        assert version.self_weight == w[i, i]
        assert version.neighbours == {DEVICES[j]: w[i, j] for j in graph.neighbours(i)}
        assert version.self_weight + sum(version.neighbours.values()) == pytest.approx(1.0)


def test_a_device_missing_from_the_version_is_removed() -> None:
    version = TopologyVersion.from_control(_message([[0, 1]]), "device-x", "metropolis-hastings")
    assert version is not None and version.removed and version.neighbours == {}


@pytest.mark.parametrize(
    "bad",
    [
        {"edges": [[0, 64]]},
        {"edges": [[3, 3]]},
        {"edges": [["a", 1]]},
        {"edges": None},
        {"devices": None},
        {"version": "two"},
    ],
)
def test_a_malformed_message_is_refused_by_the_decoder(bad: dict[str, Any]) -> None:
    with pytest.raises(PayloadError):
        decode_control(json.dumps({**_body([[0, 1], [1, 2]]), **bad}).encode())


def test_the_edges_are_far_smaller_than_a_dense_w() -> None:
    graph = build_graph("random-regular", 256, degree=4, seed=0)
    devices = [f"device-{k}" for k in range(256)]
    edges = json.dumps({"devices": devices, "edges": sorted([i, j] for i, j in graph.edges)})
    dense = json.dumps({"devices": devices, "W": mixing_matrix(graph).tolist()})
    assert len(edges) < 10_000 < 250_000 < len(dense)
