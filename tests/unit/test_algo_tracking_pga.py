"""Compressed gradient tracking (BEER) and periodic global averaging (Gossip-PGA)."""

from __future__ import annotations

import numpy as np
import pytest

from meshfl.aggregation import ChocoGossip
from meshfl.aggregation.pga import is_global_round, pga_row
from meshfl.aggregation.tracking import GradientTracking
from meshfl.codecs import Identity, Sign
from meshfl.errors import ConfigError
from meshfl.topology import complete, metropolis_hastings, ring

N = 5
IDS = [f"dev{i}" for i in range(N)]


def models(seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"w": rng.standard_normal((3, 2)).astype(np.float32)} for _ in range(N)]


def trackers(graph: object, x0: dict, codec: object) -> list[GradientTracking]:
    w = metropolis_hastings(graph)  # type: ignore[arg-type]
    return [
        GradientTracking(
            x0,
            {IDS[j]: float(w[i, j]) for j in graph.neighbours(i)},  # type: ignore[attr-defined]
            float(w[i, i]),
            1.0,
            codec,
        )
        for i in range(N)
    ]


def track_round(nodes: list[GradientTracking], starts: list, locals_: list) -> list[dict]:
    msgs = [n.outgoing(s, x, 0.1) for n, s, x in zip(nodes, starts, locals_, strict=True)]
    for node in nodes:
        for peer in node.neighbours:
            node.incoming(peer, msgs[IDS.index(peer)])
    return [n.mix(s) for n, s in zip(nodes, starts, strict=True)]


def test_first_round_from_a_shared_start_is_the_local_model() -> None:
    x0 = models(0)[0]
    nodes = trackers(ring(N), x0, Identity())
    locals_ = models(1)
    out = track_round(nodes, [x0] * N, locals_)
    for o, loc in zip(out, locals_, strict=True):
        # h replicas all x⁰: gossip term 0; v = p = (x⁰ − x_local)/η; x = x⁰ − η v
        np.testing.assert_allclose(o["w"], loc["w"], rtol=1e-5, atol=1e-6)


def test_tracker_sum_equals_pseudo_gradient_sum_and_average_is_fedavg() -> None:
    x0 = models(0)[0]
    nodes = trackers(complete(N), x0, Identity())
    starts = [x0] * N
    rng = np.random.default_rng(4)
    for _ in range(4):
        locals_ = [
            {"w": s["w"] - 0.1 * rng.standard_normal((3, 2)).astype(np.float32)} for s in starts
        ]
        out = track_round(nodes, starts, locals_)
        p_sum = sum(
            (s["w"] - x["w"]).astype(np.float64) / 0.1 for s, x in zip(starts, locals_, strict=True)
        )
        v_sum = sum(n.tracker()["w"].astype(np.float64) for n in nodes)
        np.testing.assert_allclose(v_sum, p_sum, rtol=1e-4, atol=1e-4)
        # complete graph + identity: the network average moves exactly as FedAvg's
        fedavg = np.mean([x["w"].astype(np.float64) for x in locals_], axis=0)
        np.testing.assert_allclose(np.mean([o["w"] for o in out], axis=0), fedavg, atol=1e-5)
        starts = out


def test_tracking_sends_model_and_tracker_differences() -> None:
    x0 = models(0)[0]
    node = trackers(ring(N), x0, Sign())[0]
    msg = node.outgoing(x0, models(2)[0], 0.1)
    assert [e.name for e in msg] == ["h/w", "g/w"]
    with pytest.raises(ConfigError, match="mix before outgoing"):
        trackers(ring(N), x0, Sign())[0].mix(x0)


def test_pga_schedule() -> None:
    w = metropolis_hastings(ring(N))
    assert [is_global_round(r, 3) for r in range(1, 7)] == [False, False, True] * 2
    np.testing.assert_array_equal(pga_row(w, 2, 3), w)
    np.testing.assert_allclose(pga_row(w, 3, 3), np.full((N, N), 1 / N))
    with pytest.raises(ConfigError, match="period H"):
        pga_row(w, 1, 0)
    with pytest.raises(ConfigError, match="square"):
        pga_row(np.ones((2, 3)), 1, 1)


def test_pga_global_round_with_choco_identity_is_exact_average() -> None:
    xs = models(5)
    x0 = xs[0]
    w_global = pga_row(metropolis_hastings(ring(N)), 4, 4)
    nodes = [
        ChocoGossip(
            x0,
            {IDS[j]: float(w_global[i, j]) for j in range(N) if j != i},
            float(w_global[i, i]),
            1.0,
            Identity(),
            shared_start=True,
        )
        for i in range(N)
    ]
    msgs = [n.outgoing(x) for n, x in zip(nodes, xs, strict=True)]
    for i, n in enumerate(nodes):
        for j in range(N):
            if j != i:
                n.incoming(IDS[j], msgs[j])
    mean = np.mean([x["w"].astype(np.float64) for x in xs], axis=0)
    for i, n in enumerate(nodes):
        out = n.mix(xs[i], {IDS[j] for j in range(N) if j != i})
        np.testing.assert_allclose(out["w"], mean, rtol=1e-5, atol=1e-6)


def test_a_nan_model_changes_no_state() -> None:
    from meshfl.aggregation.ef_averaging import EFAveraging
    from meshfl.aggregation.epidemic import EpidemicGossip
    from meshfl.errors import CodecError

    x0 = models(0)[0]
    bad = {"w": np.full((3, 2), np.nan, np.float32)}
    tracker = trackers(ring(N), x0, Sign())[0]
    with pytest.raises(CodecError):
        tracker.outgoing(x0, bad, 0.1)
    np.testing.assert_array_equal(tracker.tracker()["w"], np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="mix before outgoing"):
        tracker.mix(x0)
    epidemic = EpidemicGossip(x0, IDS[0], IDS, 2, Sign())
    with pytest.raises(CodecError):
        epidemic.outgoing(bad, 1)
    for peer in IDS[1:]:
        np.testing.assert_array_equal(epidemic.edge_replica(peer, "out")["w"], x0["w"])
    averaging = EFAveraging(x0, {IDS[1]: 0.5}, 0.5, Sign(), self_id=IDS[0])
    with pytest.raises(CodecError):
        averaging.outgoing(bad)
    assert averaging.residual_norm() == 0.0
