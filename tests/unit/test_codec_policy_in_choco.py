"""CHOCO-SGD with a per-tensor codec policy: small tensors dense, density from a budget."""

from __future__ import annotations

import numpy as np

from meshfl.aggregation import ChocoGossip
from meshfl.codecs import CodecPolicy, Identity, TopK

LAYOUT = {"w": np.zeros((64, 64), np.float32), "b": np.zeros(64, np.float32)}


def test_small_tensors_go_dense_and_large_ones_compressed() -> None:
    policy = CodecPolicy.from_options(TopK(0.1), [(k, v.shape) for k, v in LAYOUT.items()],
                                      dense_below=256)  # fmt: skip
    node = ChocoGossip(LAYOUT, {"peer": 0.5}, 0.5, consensus_step=0.5, codec=policy)
    rng = np.random.default_rng(0)
    x = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in LAYOUT.items()}

    message = {e.name: e for e in node.outgoing(x)}

    assert message["b"].codec == Identity.tag and message["w"].codec == TopK.tag
    np.testing.assert_array_equal(np.frombuffer(message["b"].payload, "<f4"), x["b"])


def test_a_byte_budget_sets_the_density_that_fits() -> None:
    layout = [(k, v.shape) for k, v in LAYOUT.items()]
    policy = CodecPolicy.from_options(TopK(0.5), layout, dense_below=256, byte_budget=2_000)
    node = ChocoGossip(LAYOUT, {"peer": 0.5}, 0.5, consensus_step=0.5, codec=policy)
    x = {k: np.random.default_rng(1).normal(size=v.shape).astype(np.float32)
         for k, v in LAYOUT.items()}  # fmt: skip

    message = node.outgoing(x)

    assert sum(len(e.payload) for e in message) <= 2_000
    assert sum(len(e.payload) for e in message) > 1_500  # and uses most of it
