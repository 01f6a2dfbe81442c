"""EFAveraging: serverless averaging of error-compensated compressed updates."""

from __future__ import annotations

import numpy as np
import pytest

from meshfl.aggregation.ef_averaging import EFAveraging
from meshfl.codecs import Identity, Sign
from meshfl.errors import ConfigError, WireError

N = 4
IDS = [f"dev{i}" for i in range(N)]


def make(x0: dict[str, np.ndarray], codec: object, n: int = N) -> list[EFAveraging]:
    return [
        EFAveraging(
            x0, {IDS[j]: 1.0 / n for j in range(n) if j != i}, 1.0 / n, codec, self_id=IDS[i]
        )
        for i in range(n)
    ]


def round_(nodes: list[EFAveraging], xs: list[dict[str, np.ndarray]]) -> list[dict]:
    msgs = [node.outgoing(x) for node, x in zip(nodes, xs, strict=True)]
    for i, node in enumerate(nodes):
        for j, m in enumerate(msgs):
            if j != i:
                node.incoming(IDS[j], m)
    return [node.mix(x) for node, x in zip(nodes, xs, strict=True)]


def test_identity_codec_is_exact_averaging_on_every_device() -> None:
    rng = np.random.default_rng(0)
    x0 = {"w": rng.standard_normal((3, 5)).astype(np.float32), "b": np.zeros(5, np.float32)}
    nodes = make(x0, Identity())
    xs = [
        {k: v + rng.standard_normal(v.shape).astype(np.float32) for k, v in x0.items()}
        for _ in range(N)
    ]
    out = round_(nodes, xs)
    for k in x0:
        expected = np.mean([x[k].astype(np.float64) for x in xs], axis=0)
        for o in out:
            np.testing.assert_allclose(o[k], expected, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(o[k], out[0][k])  # bit-identical copies of z


def test_sign_codec_hand_computed_with_error_feedback() -> None:
    x0 = {"w": np.zeros(2, np.float32)}
    nodes = make(x0, Sign(), n=2)
    xs = [{"w": np.array([1.0, -3.0], np.float32)}, {"w": np.array([2.0, 2.0], np.float32)}]
    out = round_(nodes, xs)
    # device 0: Δ = (1, −3), scale 2 → D(q) = (2, −2), residual (−1, −1)
    # device 1: Δ = (2, 2), scale 2 → D(q) = (2, 2), residual (0, 0)
    np.testing.assert_allclose(out[0]["w"], [2.0, 0.0])
    np.testing.assert_array_equal(out[0]["w"], out[1]["w"])
    assert nodes[0].residual_norm() == pytest.approx(np.sqrt(2.0))
    assert nodes[1].residual_norm() == 0.0
    # next round, nobody trains: device 0 re-sends its residual (−1, −1)
    out = round_(nodes, [dict(out[0]), dict(out[1])])
    np.testing.assert_allclose(out[0]["w"], [1.5, -0.5])
    assert nodes[0].residual_norm() == 0.0


def test_a_late_update_is_applied_in_the_round_it_arrives() -> None:
    x0 = {"w": np.zeros(3, np.float32)}
    a, b = make(x0, Identity(), n=2)
    xa, xb = {"w": np.ones(3, np.float32)}, {"w": np.full(3, 3.0, np.float32)}
    ma, mb = a.outgoing(xa), b.outgoing(xb)
    b.incoming(IDS[0], ma)
    np.testing.assert_allclose(a.mix(xa)["w"], 0.5)  # b's update not there yet
    np.testing.assert_allclose(b.mix(xb)["w"], 2.0)
    a.incoming(IDS[1], mb)
    out = a.outgoing({"w": np.full(3, 0.5, np.float32)})  # no training: Δ = 0
    assert out
    np.testing.assert_allclose(a.mix({"w": np.zeros(3, np.float32)})["w"], 2.0)


def test_bad_messages_and_settings_are_refused() -> None:
    x0 = {"w": np.zeros(3, np.float32)}
    a, b = make(x0, Identity(), n=2)
    msg = b.outgoing({"w": np.ones(3, np.float32)})
    with pytest.raises(WireError, match="not a neighbour"):
        a.incoming("stranger", msg)
    a.incoming(IDS[1], msg)
    with pytest.raises(WireError, match="second update"):
        a.incoming(IDS[1], msg)
    with pytest.raises(ConfigError, match="mix before outgoing"):
        a.mix(x0)
    with pytest.raises(ConfigError, match="sum to 1"):
        EFAveraging(x0, {"x": 0.5}, 0.6, Identity())
    with pytest.raises(ConfigError, match="Codec"):
        EFAveraging(x0, {"x": 0.5}, 0.5, "sign")  # type: ignore[arg-type]


def test_keyframe_repairs_z() -> None:
    x0 = {"w": np.zeros(2, np.float32)}
    a, b = make(x0, Identity(), n=2)
    round_([a, b], [{"w": np.ones(2, np.float32)}, {"w": np.full(2, 3.0, np.float32)}])
    fresh = make(x0, Identity(), n=2)[1]
    fresh.incoming_keyframe(IDS[0], a.keyframe(x0))
    np.testing.assert_array_equal(fresh.shared_model()["w"], a.shared_model()["w"])
