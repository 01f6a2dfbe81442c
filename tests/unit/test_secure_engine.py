"""Secure aggregation between neighbours, end to end over the in-memory bus."""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import pytest
from secure_scenarios import JOB, Device, build_fleet, complete_graph, run_rounds

from edge_agent.secure_engine import SecureEngine
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.aggregation import pack_words
from meshfl.wire import MessageKind
from meshfl.wire.secagg import encode_declaration, encode_request


@pytest.fixture
def bus() -> MemoryBroker:
    return MemoryBroker()


def expected_sum(devices: dict[str, Device], aggregator: str, round_index: int,
                 senders: set[str]) -> np.ndarray:  # fmt: skip
    """Σ of the senders' contributions (dequantized, noise included) to ``aggregator``."""
    total = 0.0
    for name in senders:
        made = [c for c in devices[name].contributions if c.aggregator == aggregator]
        total = total + made[round_index].value
    return np.asarray(total)


@pytest.mark.parametrize("density", [1.0, 0.3])  # dense fixed point, shared-seed random-k
def test_the_unmasked_sum_is_exactly_the_sum_of_the_inputs(
    bus: MemoryBroker, density: float
) -> None:
    graph = complete_graph(4)
    devices, coordinator = build_fleet(
        lambda _: MemoryTransport(bus), graph, rounds=3, threshold=2, density=density
    )
    mean0 = np.mean([d.x["w"] for d in devices.values()], axis=0)

    run_rounds(devices, 3)

    for name, device in devices.items():
        assert device.missing == [[], [], []]
        assert device.engine.stats.aggregated == 3 and device.engine.stats.committed == 9
        for r in range(3):
            # Masks cancel exactly: the decoded sum equals the sum of the quantized inputs.
            np.testing.assert_allclose(
                device.absorbed[r], expected_sum(devices, name, r, set(graph[name])), atol=1e-9
            )
    # γ = 1 on a doubly stochastic W: the average model is kept (up to quantization).
    mean = np.mean([d.x["w"] for d in devices.values()], axis=0)
    np.testing.assert_allclose(mean, mean0, atol=1e-3)
    if density == 1.0:
        spread = np.std([d.x["w"] for d in devices.values()], axis=0).max()
        assert spread < 1e-2  # K4 with MH weights averages in one round
    assert all(not s["declaration"]["dropped"] for s in coordinator.declarations.values())


class _NoInputs(SecureEngine):
    """Sends its shares but never its masked inputs (it dies after masking)."""

    def _send(self, dst: str, kind: MessageKind, round_: int, tensors: tuple) -> None:  # type: ignore[override]
        if kind != MessageKind.SECURE_INPUT:
            super()._send(dst, kind, round_, tensors)


def _die_after(device: Device) -> threading.Thread:
    """Run round 1's sending part only, then crash (the Last Will says offline)."""

    def work() -> None:
        device.engine.start()
        device.engine.wait_ready(10.0)
        device.engine._round = 1
        device.engine._send_shares(1)
        device.engine._await_shares(1, device.engine.clock() + 10.0)
        device.engine._send_inputs(1, device.x)
        device.transport.kill()  # type: ignore[attr-defined]

    return threading.Thread(target=work, daemon=True)


@pytest.mark.parametrize("sent_its_input", [False, True])
def test_one_of_four_neighbours_drops_after_masking(
    bus: MemoryBroker, sent_its_input: bool
) -> None:
    graph, dead = complete_graph(5), "dev-4"  # neighbourhoods of 4; t = 3 survives 1 dropout
    classes = {} if sent_its_input else {dead: _NoInputs}
    devices, coordinator = build_fleet(
        lambda _: MemoryTransport(bus), graph, rounds=1, threshold=3, engine_classes=classes
    )
    crash = _die_after(devices[dead])
    crash.start()
    alive = set(devices) - {dead}

    run_rounds(devices, 1, only=alive)
    crash.join(10.0)

    for name in alive:
        device = devices[name]
        # Without its input, dev-4 is declared dropped and its pairwise masks are removed
        # from its mask-key shares; with it, its self-mask is rebuilt from b-shares.
        survivors = set(graph[name]) - (set() if sent_its_input else {dead})
        declared = coordinator.declarations[(1, name)]["declaration"]
        assert set(declared["survivors"]) == survivors and not declared["aborted"]
        assert device.engine.stats.aggregated == 1, name
        assert device.missing == [sorted(set(graph[name]) - survivors)]
        np.testing.assert_allclose(
            device.absorbed[0], expected_sum(devices, name, 0, survivors), atol=1e-9
        )


def test_below_the_threshold_the_round_aborts_and_nothing_is_reconstructed(
    bus: MemoryBroker,
) -> None:
    graph = complete_graph(5)
    classes: dict[str, type[SecureEngine]] = {"dev-3": _NoInputs, "dev-4": _NoInputs}
    devices, coordinator = build_fleet(
        lambda _: MemoryTransport(bus), graph, rounds=1, threshold=3, engine_classes=classes
    )
    crashes = [_die_after(devices[d]) for d in ("dev-3", "dev-4")]
    for crash in crashes:
        crash.start()
    alive = {"dev-0", "dev-1", "dev-2"}
    before = {d: devices[d].x["w"].copy() for d in alive}

    run_rounds(devices, 1, only=alive)

    for name in alive:
        device = devices[name]
        assert coordinator.declarations[(1, name)]["declaration"]["aborted"]
        assert device.engine.stats.aborted == 1 and device.absorbed == []
        assert device.missing == [sorted(graph[name])]
        assert device.engine.stats.committed == 0  # no sender counts its input as included
        np.testing.assert_array_equal(device.x["w"], before[name])  # nothing was mixed in
        assert device.engine.holder.refusals == 0


class _LateInputs(SecureEngine):
    """Sends its masked inputs 1.5 s late: after its aggregators declared it dropped."""

    def _send(self, dst: str, kind: MessageKind, round_: int, tensors: tuple) -> None:  # type: ignore[override]
        if kind == MessageKind.SECURE_INPUT:
            later = super()._send
            threading.Timer(1.5, later, args=(dst, kind, round_, tensors)).start()
        else:
            super()._send(dst, kind, round_, tensors)


def test_a_masked_input_after_its_sender_was_declared_dropped_is_ignored(
    bus: MemoryBroker,
) -> None:
    graph, late = complete_graph(4), "dev-3"
    devices, _ = build_fleet(lambda _: MemoryTransport(bus), graph, rounds=1, threshold=2,
                             deadline_s=0.5, engine_classes={late: _LateInputs})  # fmt: skip

    run_rounds(devices, 1)
    threading.Event().wait(1.5)  # let the late inputs arrive
    for device in devices.values():
        device.engine.drain(0.3)

    for name in set(devices) - {late}:
        device = devices[name]
        assert device.missing == [[late]]
        assert device.engine.stats.late_ignored == 1
        survivors = set(graph[name]) - {late}
        np.testing.assert_allclose(
            device.absorbed[0], expected_sum(devices, name, 0, survivors), atol=1e-9
        )
        # dev-3 is told it was dropped: it does not commit that edge's replica update.
    assert devices[late].engine.stats.committed == 0


def test_a_request_with_a_forged_declaration_is_rejected(bus: MemoryBroker) -> None:
    graph = complete_graph(3)
    devices, _ = build_fleet(lambda _: MemoryTransport(bus), graph, rounds=1, threshold=2)
    run_rounds(devices, 1)
    victim, forger = devices["dev-0"], devices["dev-1"]
    # dev-1 claims dev-2 dropped in round 1 to get dev-2's mask-key share; it signs the
    # declaration itself, since the coordinator already signed the real one.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    fake = {"job": JOB, "round": 1, "aggregator": "dev-1", "survivors": ["dev-0"],
            "dropped": ["dev-2"], "aborted": False}  # fmt: skip
    signature = Ed25519PrivateKey.generate().sign(encode_declaration(fake))
    body = encode_request(fake, base64.b64encode(signature).decode())
    forger.engine._send_body("dev-0", 1, body)  # fmt: skip
    rejected = victim.engine.stats.rejected
    victim.engine.drain(0.5)

    assert victim.engine.stats.rejected == rejected + 1
    assert "signature" in victim.engine.stats.rejected_reasons[-1]


def test_broker_traffic_holds_no_plaintext_contribution(bus: MemoryBroker) -> None:
    captured: list[bytes] = []
    sniffer = MemoryTransport(bus)
    sniffer.connect("sniffer")
    sniffer.set_handler(lambda topic, payload: captured.append(bytes(payload)))
    sniffer.subscribe("meshfl/#", qos=1)
    graph = complete_graph(4)
    devices, _ = build_fleet(lambda _: MemoryTransport(bus), graph, rounds=2, threshold=2)

    run_rounds(devices, 2)

    traffic = b"".join(captured)
    assert len(traffic) > 10_000
    bits = next(iter(devices.values())).engine.fixed_point.modulus_bits
    checked = 0
    for device in devices.values():
        for c in device.contributions:
            for plain in (pack_words(c.encoded, bits), c.value.astype(np.float32).tobytes()):
                for start in range(0, len(plain) - 16, 16):
                    window = plain[start : start + 16]
                    if len(set(window)) > 4:  # skip runs of equal bytes
                        assert window not in traffic
                        checked += 1
    assert checked > 100


def test_a_device_dead_before_the_round_is_left_out_of_every_mask(bus: MemoryBroker) -> None:
    graph, dead = complete_graph(5), "dev-4"
    devices, coordinator = build_fleet(lambda _: MemoryTransport(bus), graph, rounds=1,
                                       threshold=3, deadline_s=20.0)  # fmt: skip

    def crash() -> None:  # ready, then gone before sending anything of round 1
        devices[dead].engine.start()
        devices[dead].engine.wait_ready(10.0)
        devices[dead].transport.kill()  # type: ignore[attr-defined]

    killer = threading.Thread(target=crash, daemon=True)
    killer.start()
    killer.join(15.0)
    started = time.monotonic()
    run_rounds(devices, 1, only=set(devices) - {dead})

    assert time.monotonic() - started < 15.0  # its Last Will ends every wait early
    for name in set(devices) - {dead}:
        device = devices[name]
        declared = coordinator.declarations[(1, name)]["declaration"]
        assert declared["dropped"] == [] and dead not in declared["survivors"]
        assert device.engine.stats.aggregated == 1 and device.missing == [[dead]]
        survivors = set(graph[name]) - {dead}
        np.testing.assert_allclose(
            device.absorbed[0], expected_sum(devices, name, 0, survivors), atol=1e-9
        )


class _Replayer(SecureEngine):
    """Also sends each masked input, unchanged, to every other aggregator it serves."""

    def _send(self, dst: str, kind: MessageKind, round_: int, tensors: tuple) -> None:  # type: ignore[override]
        super()._send(dst, kind, round_, tensors)
        if kind == MessageKind.SECURE_INPUT:
            for other in self.neighbours:
                if other != dst:
                    super()._send(other, kind, round_, tensors)


def test_a_masked_input_replayed_to_another_aggregator_is_refused(bus: MemoryBroker) -> None:
    graph = complete_graph(4)
    devices, _ = build_fleet(lambda _: MemoryTransport(bus), graph, rounds=2, threshold=2,
                             engine_classes={"dev-0": _Replayer})  # fmt: skip

    run_rounds(devices, 2)

    for name in set(devices) - {"dev-0"}:
        device = devices[name]
        deadline = time.monotonic() + 5.0  # a replay may still be in the mailbox on a busy host
        while device.engine.stats.rejected < 1 and time.monotonic() < deadline:
            device.engine.drain(0.05)  # its round is over: nothing else handles the mailbox
        assert device.engine.stats.rejected >= 1  # the replays, each counted
        assert "not addressed to this aggregator" in " ".join(device.engine.stats.rejected_reasons)
        for r in range(2):  # and the sums are still exactly the inputs' sums
            np.testing.assert_allclose(
                device.absorbed[r], expected_sum(devices, name, r, set(graph[name])), atol=1e-9
            )
