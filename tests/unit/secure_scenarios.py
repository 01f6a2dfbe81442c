"""A fleet of secure-aggregation engines on one bus, with a stand-in for the coordinator.

The coordinator's two roles in the protocol are played here exactly as the real one plays
them (``coordinator/secagg.py``): the key directory (bundles verified against enrolled
identity keys) and the declarations (first write wins, Ed25519-signed).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from edge_agent.secagg.crypto import IdentityKey, JobKeys, verify_bundle
from edge_agent.secagg.keyring import Directory
from edge_agent.secure_engine import SecureEngine
from edge_agent.transport.base import Message, Transport
from meshfl.aggregation import Contribution, FixedPoint, SecureChoco
from meshfl.contract import Declaration, SignedDeclaration
from meshfl.wire import status_topic
from meshfl.wire.secagg import encode_declaration

FLEET, JOB = "lab", "job-secure"


def complete_graph(n: int) -> dict[str, tuple[str, ...]]:
    ids = [f"dev-{k}" for k in range(n)]
    return {d: tuple(p for p in ids if p != d) for d in ids}


class Coordinator:
    """Signs one declaration per (round, aggregator), like the real coordinator."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_b64 = base64.b64encode(raw).decode()
        self.declarations: dict[tuple[int, str], SignedDeclaration] = {}
        self.lock = threading.Lock()

    def sign(self, declaration: Declaration) -> SignedDeclaration:
        signature = self.key.sign(encode_declaration(declaration))
        return {"declaration": declaration, "signature": base64.b64encode(signature).decode()}

    def declare(self, declaration: Declaration) -> SignedDeclaration:
        with self.lock:
            key = (declaration["round"], declaration["aggregator"])
            return self.declarations.setdefault(key, self.sign(declaration))


@dataclass
class Device:
    """One device's engine and what it did (contributions made, sums absorbed)."""

    engine: SecureEngine
    transport: Transport
    x: dict[str, np.ndarray]
    contributions: list[Contribution] = field(default_factory=list)
    absorbed: list[np.ndarray] = field(default_factory=list)
    missing: list[list[str]] = field(default_factory=list)
    error: BaseException | None = None


def build_fleet(
    make_transport: Callable[[str], Transport],
    graph: Mapping[str, tuple[str, ...]],
    *,
    rounds: int,
    threshold: int,
    deadline_s: float = 5.0,
    codec_bits: int = 16,
    density: float = 1.0,
    engine_classes: Mapping[str, type[SecureEngine]] | None = None,
    seed: int = 0,
) -> tuple[dict[str, Device], Coordinator]:
    """Engines for every device of ``graph`` (Metropolis–Hastings weights), connected."""
    coordinator = Coordinator()
    ids = sorted(graph)
    identities = {d: IdentityKey.generate() for d in ids}
    keys = {d: JobKeys.create(JOB, d, rounds, len(graph[d])) for d in ids}
    bundles = {
        d: verify_bundle(keys[d].bundle(identities[d]), identities[d].public_b64, rounds,
                         len(graph[d]))
        for d in ids
    }  # fmt: skip
    directory = Directory(threshold, coordinator.public_b64, dict(graph), bundles)
    fixed_point = FixedPoint.choose(4.0, codec_bits, max(len(v) for v in graph.values()))
    rng = np.random.default_rng(seed)
    devices: dict[str, Device] = {}
    for d in ids:
        weights = {p: 1.0 / (1 + max(len(graph[d]), len(graph[p]))) for p in graph[d]}
        x = {
            "w": rng.normal(size=(6, 5)).astype(np.float32),
            "b": rng.normal(size=5).astype(np.float32),
        }
        algorithm = SpyChoco(
            {"w": np.zeros((6, 5), np.float32), "b": np.zeros(5, np.float32)},
            weights,
            1.0 - sum(weights.values()),
            consensus_step=1.0,
            fixed_point=fixed_point,
            density=density,
        )
        transport = make_transport(d)
        transport.connect(
            d, will=Message(status_topic(FLEET, d), b'{"state": "offline"}', retain=True)
        )
        engine = (engine_classes or {}).get(d, SecureEngine)(
            transport=transport,
            declare=coordinator.declare,
            fleet=FLEET,
            job_id=JOB,
            device_id=d,
            directory=directory,
            keys=keys[d],
            algorithm=algorithm,
            fixed_point=fixed_point,
            density=density,
            deadline_s=deadline_s,
            max_payload=4096,
            rng=np.random.default_rng(seed + 1 + len(devices)),
        )
        devices[d] = Device(engine, transport, x, algorithm.made, algorithm.sums)
    return devices, coordinator


class SpyChoco(SecureChoco):
    """Records every contribution made and every sum absorbed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made: list[Contribution] = []
        self.sums: list[np.ndarray] = []

    def contribution(self, *args: Any, **kwargs: Any) -> Contribution:
        made = super().contribution(*args, **kwargs)
        self.made.append(made)
        return made

    def absorb(self, total: np.ndarray, indices: np.ndarray | None) -> None:
        self.sums.append(np.array(total))
        super().absorb(total, indices)


def run_rounds(devices: Mapping[str, Device], rounds: int, only: set[str] | None = None) -> None:
    """Start every engine, then run ``rounds`` rounds on one thread per device."""

    def work(device: Device) -> None:
        try:
            device.engine.start()
            device.engine.wait_ready(10.0)
            for r in range(1, rounds + 1):
                device.x, missing = device.engine.exchange(r, device.x)
                device.missing.append(missing)
        except BaseException as exc:  # reported by the test
            device.error = exc

    threads = [
        threading.Thread(target=work, args=(d,), daemon=True)
        for name, d in devices.items()
        if only is None or name in only
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120.0)
    for name, d in devices.items():
        if d.error is not None:
            raise AssertionError(f"{name} failed") from d.error
