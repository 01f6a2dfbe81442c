"""What signed deltas cost: Ed25519 sign and verify of W1-size envelopes (a microbenchmark).

W1's model is the MLP 64-64-10 (4,810 parameters). For its default message (CHOCO-SGD,
top-k 0.15), a dense fp32 one (D-PSGD, or a keyframe) and a 100 KB one, this times
``encode_envelope`` with and without a signer and ``decode_envelope_signed`` plus
verification, as the agent does them (``edge_agent.signing``), median of many runs.

    python benchmarks/signing.py [--repeats 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from edge_agent.secagg.crypto import IdentityKey
from edge_agent.signing import Signer, Verifier
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.wire import Envelope, MessageKind, new_message_id
from meshfl.wire.serde import decode_envelope_signed, encode_envelope

W1_SHAPES = {"0.weight": (64, 64), "0.bias": (64,), "2.weight": (10, 64), "2.bias": (10,)}


def envelope(codec: str, scale: int = 1) -> Envelope:
    """A W1 delta encoded with ``codec`` (``scale`` copies of the model: a bigger one)."""
    rng = np.random.default_rng(0)
    x0 = {
        f"{k}.{s}": rng.normal(size=shape).astype(np.float32)
        for k, shape in W1_SHAPES.items()
        for s in range(scale)
    }
    x1 = {k: v + rng.normal(scale=0.01, size=v.shape).astype(np.float32) for k, v in x0.items()}
    choco = ChocoGossip(x0, {"peer": 0.5}, 0.5, consensus_step=0.9, codec=parse_codec(codec))
    return Envelope(
        MessageKind.DELTA, "lab", "job-w1", 7, "dev-1", new_message_id(), 7, choco.outgoing(x1)
    )


def median_us(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    key = IdentityKey.generate()
    sign, verifier = Signer(key), Verifier({"dev-1": key.public_b64})
    print(f"## signed deltas: Ed25519 cost per message ({describe()})\n")
    print("| message | bytes | encode µs | encode+sign µs | decode µs | decode+verify µs |")
    print("|---|---|---|---|---|---|")
    for label, env in (
        ("W1 CHOCO top-k 0.15 (default)", envelope("topk:0.15")),
        ("W1 dense fp32 (D-PSGD, keyframe)", envelope("identity")),
        ("~100 KB (5× W1, fp32)", envelope("identity", scale=5)),
    ):
        data = encode_envelope(env, sign)
        assert verifier.verify(decode_envelope_signed(data)) is None
        plain = encode_envelope(env)
        row = [
            median_us(lambda e=env: encode_envelope(e), args.repeats),
            median_us(lambda e=env: encode_envelope(e, sign), args.repeats),
            median_us(lambda d=plain: decode_envelope_signed(d), args.repeats),
            median_us(lambda d=data: verifier.verify(decode_envelope_signed(d)), args.repeats),
        ]
        print(f"| {label} | {len(data)} | " + " | ".join(f"{v:.0f}" for v in row) + " |")


if __name__ == "__main__":
    main()
