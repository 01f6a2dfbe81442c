"""Signed deltas: Ed25519 envelopes, verification before use, replay refusal, counters."""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, models, reference
from signed_scenarios import run_round, signed_engines

from edge_agent.engine import GossipEngine
from edge_agent.secagg.crypto import IdentityKey
from edge_agent.secure_engine import SecureEngine
from edge_agent.signing import RejectLog, ReplayWindow, Signer, Verdict, Verifier
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.errors import ConfigError
from meshfl.wire import (
    Envelope,
    MessageKind,
    delta_topic,
    inbox_topic,
    new_message_id,
    split_message,
)
from meshfl.wire.serde import SIGNATURE_BYTES, decode_envelope_signed, encode_envelope

KEY_A, KEY_B = IdentityKey.generate(), IdentityKey.generate()
PEER_KEYS = {"dev-a": KEY_A.public_b64, "dev-b": KEY_B.public_b64}


X0 = models(1)[0]


def choco(peer: str) -> ChocoGossip:
    """CHOCO-SGD with one peer, both starting from X0 (replicas exact from the start)."""
    codec = parse_codec("identity")
    return ChocoGossip(X0, {peer: 0.5}, 0.5, consensus_step=0.5, codec=codec, shared_start=True)


def envelope(sender: str = "dev-b", sequence: int = 1, round_: int = 1, **kw: Any) -> Envelope:
    tensors = choco("dev-a").outgoing({k: v + 1 for k, v in X0.items()})
    fields: dict[str, Any] = dict(
        kind=MessageKind.DELTA, fleet=FLEET, job=JOB, round=round_, sender=sender,
        message_id=new_message_id(), sequence=sequence, tensors=tensors,
    )  # fmt: skip
    fields.update(kw)
    return Envelope(**fields)


def with_crc(body: bytes) -> bytes:
    return body + struct.pack("!I", zlib.crc32(body))


# --- signer and verifier ---------------------------------------------------------------------


def test_sign_verify_round_trip() -> None:
    data = encode_envelope(envelope(), sign=Signer(KEY_B))
    decoded = decode_envelope_signed(data)
    assert decoded.signature is not None and len(decoded.signature) == SIGNATURE_BYTES
    assert Verifier(PEER_KEYS).verify(decoded) is None


def test_flipped_payload_byte_is_a_bad_signature() -> None:
    data = bytearray(encode_envelope(envelope(), sign=Signer(KEY_B))[:-4])
    data[-SIGNATURE_BYTES - 1] ^= 0x01  # last payload byte; the CRC is recomputed
    decoded = decode_envelope_signed(with_crc(bytes(data)))
    assert Verifier(PEER_KEYS).verify(decoded) is Verdict.BAD_SIGNATURE


def test_spoofed_sender_and_unknown_sender_are_bad_signatures() -> None:
    spoof = decode_envelope_signed(encode_envelope(envelope("dev-b"), sign=Signer(KEY_A)))
    stranger = decode_envelope_signed(encode_envelope(envelope("dev-x"), sign=Signer(KEY_A)))
    unsigned = decode_envelope_signed(encode_envelope(envelope("dev-b")))
    verifier = Verifier(PEER_KEYS)
    assert verifier.verify(spoof) is Verdict.BAD_SIGNATURE
    assert verifier.verify(stranger) is Verdict.BAD_SIGNATURE
    assert verifier.verify(unsigned) is Verdict.UNSIGNED


def test_verifier_learns_keys_and_refuses_garbage_keys(caplog: pytest.LogCaptureFixture) -> None:
    signed = decode_envelope_signed(encode_envelope(envelope("dev-c"), sign=Signer(KEY_A)))
    verifier = Verifier({"dev-c": "not base64!"})
    assert verifier.verify(signed) is Verdict.BAD_SIGNATURE and not verifier.has_key("dev-c")
    assert "not a base64 Ed25519 key" in caplog.text
    verifier.update({"dev-c": KEY_A.public_b64})
    assert verifier.verify(signed) is None


def test_reject_log_is_rate_limited_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    stats = type("Stats", (), {"unsigned": 0, "bad_signature": 0, "replayed": 0})()
    refuse = RejectLog(logging.getLogger("test.signing"), interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            refuse(stats, Verdict.BAD_SIGNATURE, "dev-b", 3, "t")
        now[0] = 11.0
        refuse(stats, Verdict.BAD_SIGNATURE, "dev-b", 4, "t")
    assert stats.bad_signature == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "and 4 more since" in lines[1]
    assert KEY_B.public_b64 not in caplog.text


# --- the inbox: verification before any use ------------------------------------------------


@pytest.fixture
def receiver() -> GossipEngine:
    """dev-a's engine in round 1 with dev-b as its one peer, fed by hand (never started)."""
    engine = GossipEngine(
        transport=MemoryTransport(MemoryBroker()),
        fleet=FLEET,
        job_id=JOB,
        device_id="dev-a",
        neighbours=["dev-b"],
        algorithm=choco("dev-b"),
        verifier=Verifier(PEER_KEYS),
    )
    engine._round = 1
    return engine


def deliver(engine: GossipEngine, message: bytes, message_id: bytes | None = None) -> None:
    """Hand ``message`` to the engine as chunks on dev-b's delta topic."""
    for chunk in split_message(message, message_id or new_message_id(), 512):
        engine._handle(delta_topic(FLEET, "dev-b"), chunk)


def replica(engine: GossipEngine) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in engine.algorithm.mean_of(["dev-b"]).items()}


def test_signed_delta_is_applied(receiver: GossipEngine) -> None:
    deliver(receiver, encode_envelope(envelope(), sign=Signer(KEY_B)))
    assert receiver.stats.applied == 1
    assert (receiver.stats.unsigned, receiver.stats.bad_signature, receiver.stats.replayed) == (
        0, 0, 0,
    )  # fmt: skip


def test_unsigned_and_spoofed_deltas_never_reach_the_model(receiver: GossipEngine) -> None:
    before = replica(receiver)
    deliver(receiver, encode_envelope(envelope()))
    deliver(receiver, encode_envelope(envelope(sequence=2), sign=Signer(KEY_A)))  # A as B
    assert receiver.stats.unsigned == 1 and receiver.stats.bad_signature == 1
    assert receiver.stats.applied == 0 and receiver.stats.rejected == 0
    for name, value in replica(receiver).items():
        np.testing.assert_array_equal(value, before[name])


def test_replay_is_refused_counted_and_leaves_the_model_unchanged(
    receiver: GossipEngine,
) -> None:
    message = encode_envelope(envelope(sequence=1), sign=Signer(KEY_B))
    chunk_id = new_message_id()
    deliver(receiver, message, chunk_id)
    after_first = replica(receiver)

    deliver(receiver, message, chunk_id)  # identical chunks: reassembly drops them (QoS 1)
    deliver(receiver, message)  # the same envelope bytes re-chunked: past reassembly
    older = encode_envelope(envelope(sequence=1, round_=2), sign=Signer(KEY_B))
    deliver(receiver, older)  # a validly signed message at an already-used sequence

    assert receiver.stats.applied == 1
    assert receiver.stats.replayed == 2 and receiver.duplicates > 0
    for name, value in replica(receiver).items():
        np.testing.assert_array_equal(value, after_first[name])


def test_an_honest_re_send_of_an_applied_message_is_a_duplicate_not_a_replay(
    receiver: GossipEngine,
) -> None:
    # dev-a asked for a message that was late, not lost: the first copy and the re-send
    # (on dev-a's inbox topic from dev-b) both arrive.
    message = encode_envelope(envelope(sequence=1), sign=Signer(KEY_B))
    deliver(receiver, message)
    for chunk in split_message(message, new_message_id(), 512):
        receiver._handle(inbox_topic(FLEET, "dev-a", "dev-b"), chunk)

    assert receiver.stats.applied == 1 and receiver.stats.duplicates == 1
    assert receiver.stats.replayed == 0
    deliver(receiver, message)  # the same copy again on the delta topic: a replay
    assert receiver.stats.replayed == 1


def test_first_message_from_a_round_long_gone_is_dropped_as_stale(receiver: GossipEngine) -> None:
    # A replay of a captured old message, or a new neighbour's catch-up round: neither
    # can be used (nor told apart), and a live catch-up is not an attack.
    receiver._round = 10  # this device is at round 10; dev-b never heard from before
    deliver(receiver, encode_envelope(envelope(round_=3), sign=Signer(KEY_B)))
    assert receiver.stats.stale == 1 and receiver.stats.applied == 0
    assert receiver.stats.replayed == 0
    deliver(receiver, encode_envelope(envelope(round_=9), sign=Signer(KEY_B)))  # recent
    assert receiver.stats.applied == 1


def test_replay_window_takes_each_number_once_and_nothing_below_it() -> None:
    window = ReplayWindow(size=4)
    taken = [window.accept("b", s) for s in (5, 3, 3, 6, 4, 1, 2, 5, 100, 97, 96, 97)]
    # 3 and 4 overtaken but inside the window; 1 and 2 below it (6 - 4); 96 below 100's
    assert taken == [True, True, False, True, True, False, False, False, True, True, False,
                     False]  # fmt: skip
    assert window.knows("b") and not window.knows("c") and window.accept("c", 7)
    with pytest.raises(ValueError, match="size"):
        ReplayWindow(size=0)


def test_an_overtaken_signed_delta_is_applied_not_refused(receiver: GossipEngine) -> None:
    sender = choco("dev-a")
    deltas = [
        envelope(sequence=s, tensors=sender.outgoing({k: v + s for k, v in X0.items()}))
        for s in (1, 2, 3)
    ]
    signed = [encode_envelope(env, sign=Signer(KEY_B)) for env in deltas]
    for message in (signed[0], signed[2], signed[1], signed[1]):  # 3 overtakes 2; 2 twice
        deliver(receiver, message)

    assert (receiver.stats.applied, receiver.stats.replayed) == (3, 1)
    for name, value in replica(receiver).items():  # every difference in, exactly once
        np.testing.assert_array_equal(value, sender._own[list(X0).index(name)])


def test_without_a_verifier_signatures_are_ignored() -> None:
    engine = GossipEngine(
        transport=MemoryTransport(MemoryBroker()), fleet=FLEET, job_id=JOB, device_id="dev-a",
        neighbours=["dev-b"], algorithm=choco("dev-b"),
    )  # fmt: skip
    engine._round = 2
    deliver(engine, encode_envelope(envelope(), sign=Signer(KEY_A)))  # any signature
    deliver(engine, encode_envelope(envelope(sequence=2)))  # or none
    assert engine.stats.applied == 2 and engine.stats.bad_signature == 0


# --- engines on the in-memory bus ----------------------------------------------------------


def test_signed_engines_match_the_unsigned_reference() -> None:
    bus = MemoryBroker()
    engines, transports, xs, _ = signed_engines(lambda _id: MemoryTransport(bus), 4)
    for r in range(1, 4):
        assert run_round(engines, xs, r) == [[], [], [], []]
    for t in transports:
        t.close()
    for got, want in zip(xs, reference(4, 3, "choco", "topk:0.3"), strict=True):
        np.testing.assert_array_equal(got["w"], want["w"])
    assert all(e.stats.applied == 6 and e.stats.bad_signature == 0 for e in engines)


def test_secure_engine_refuses_unsigned_and_spoofed_messages() -> None:
    from secure_scenarios import FLEET as SECURE_FLEET
    from secure_scenarios import JOB as SECURE_JOB
    from secure_scenarios import build_fleet, complete_graph, run_rounds

    keys = {d: IdentityKey.generate() for d in complete_graph(3)}
    peer_keys = {d: k.public_b64 for d, k in keys.items()}

    class Signed(SecureEngine):
        def __init__(self, **kw: Any) -> None:
            super().__init__(
                **kw, signer=Signer(keys[kw["device_id"]]), verifier=Verifier(peer_keys)
            )

    bus = MemoryBroker()
    devices, _ = build_fleet(
        lambda _d: MemoryTransport(bus), complete_graph(3), rounds=2, threshold=2,
        engine_classes=dict.fromkeys(keys, Signed),
    )  # fmt: skip
    run_rounds(devices, 2)
    a = devices["dev-0"].engine
    assert a.stats.aggregated == 2
    assert (a.stats.unsigned, a.stats.bad_signature, a.stats.replayed) == (0, 0, 0)

    topic = inbox_topic(SECURE_FLEET, "dev-0", "dev-1")
    spoof = Envelope(
        MessageKind.SECAGG, SECURE_FLEET, SECURE_JOB, 2, "dev-1", new_message_id(), 99, ()
    )
    for data in (encode_envelope(spoof), encode_envelope(spoof, sign=Signer(keys["dev-2"]))):
        for chunk in split_message(data, new_message_id(), 4096):
            a._handle(topic, chunk)
    assert (a.stats.unsigned, a.stats.bad_signature) == (1, 1)
    for d in devices.values():
        d.transport.close()


# --- the coordinator: keys to receivers, keyless devices refused -------------------------

API, ADMIN_H = "/api/v1", {"Authorization": "Bearer admin"}


@pytest.fixture
def fleet() -> Iterator[Any]:
    from test_coordinator_plan import Fleet

    made = Fleet()
    with made.client:
        yield made


def enrol(fleet: Any, name: str, key: str | None) -> str:
    """Enrol ``name`` with identity key ``key`` (base64; ``None``: without one)."""
    body = {"token": "enrol", "name": name}
    if key is not None:
        body["identity_key"] = key
    reply = fleet.client.post(f"{API}/devices/enrol", json=body).json()
    fleet.headers[reply["device_id"]] = {"Authorization": f"Bearer {reply['device_token']}"}
    return str(reply["device_id"])


def start(fleet: Any, **overrides: Any) -> Any:
    job_id = fleet.create(**overrides).json()["job_id"]
    return fleet.client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)


def test_assignment_carries_every_devices_identity_key(fleet: Any) -> None:
    keys = [IdentityKey.generate().public_b64 for _ in range(3)]
    ids = [enrol(fleet, f"pi-{k}", keys[k]) for k in range(3)]
    assert start(fleet, devices=3, topology="ring").status_code == 200

    got = fleet.assignment(ids[0]).json()

    assert got["peer_keys"] == dict(zip(ids, keys, strict=True))


def test_a_signed_job_with_a_keyless_device_is_refused(fleet: Any) -> None:
    keyed = enrol(fleet, "pi-0", IdentityKey.generate().public_b64)
    keyless = enrol(fleet, "pi-1", None)

    refused = start(fleet, devices=2, topology="ring")

    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"device {keyless} enrolled without an identity key; re-enrol it with this agent"
        " version, or create the job with signed_deltas false"
    )
    assert start(fleet, devices=2, topology="ring", signed_deltas=False).status_code == 200
    assert list(fleet.assignment(keyless).json()["peer_keys"]) == [keyed]


def test_a_keyless_device_is_not_admitted_to_an_elastic_signed_job(fleet: Any) -> None:
    ids = [enrol(fleet, f"pi-{k}", IdentityKey.generate().public_b64) for k in range(3)]
    assert start(fleet, devices=3, topology="ring", elastic=True, rounds=50).status_code == 200
    keyless = enrol(fleet, "pi-late", None)
    keyed = enrol(fleet, "pi-later", IdentityKey.generate().public_b64)

    assert fleet.assignment(keyless).status_code == 204
    joined = fleet.assignment(keyed).json()
    assert keyed in joined["peer_keys"] and joined["start_round"] >= 2
    assert set(fleet.assignment(ids[0]).json()["peer_keys"]) == {*ids, keyed}


# --- the job runner: signed by default, refusals in the round metrics ---------------------


@pytest.mark.slow  # two agents train, export ONNX (about 30 s on 2 cores)
def test_job_runner_signs_verifies_and_reports_refusals(tmp_path: Any) -> None:
    import threading
    import time

    from test_agent_models import (
        _LINK,
        DEVICES,
        FakeClient,
        _assignment,
        _config,
        _connected,
        _digits_files,
    )

    from edge_agent.job import JobRunner
    from meshfl.modelspec import from_options, with_hash

    model = with_hash(from_options("mlp", 64, 10))
    files = _digits_files(tmp_path)
    identities = [IdentityKey.generate() for _ in DEVICES]
    peer_keys = {d: k.public_b64 for d, k in zip(DEVICES, identities, strict=True)}
    bus = MemoryBroker()
    assignments = [_assignment(model, i) for i in range(len(DEVICES))]
    for assignment in assignments:
        del assignment["spec"]["signed_deltas"]  # the default: signed
        assignment["spec"]["rounds"] = 2
        assignment["peer_keys"] = peer_keys
    # Each fake coordinator still lists the job: a poll that reads none ends it early.
    clients = [FakeClient(assignment) for assignment in assignments]
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            runner = JobRunner(
                _config(tmp_path, files[i], DEVICES[i]), clients[i], _connected(bus, DEVICES[i]),
                DEVICES[i], assignments[i], link={**_LINK, "measured_at": time.time()},
                identity=identities[i],
            )  # fmt: skip
            with np.load(files[i]) as data:
                runner.run(data["x"], data["y"])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(DEVICES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    for client in clients:
        assert [m["missing"] for m in client.metrics] == [[], []]  # every delta verified
        for m in client.metrics:
            assert (m["rejected_unsigned"], m["rejected_signature"], m["rejected_replayed"]) == (
                0, 0, 0,
            )  # fmt: skip
    keyless = JobRunner(
        _config(tmp_path, files[0], DEVICES[0]), FakeClient(), _connected(bus, "x"), DEVICES[0],
        {**_assignment(model, 0), "spec": {**_assignment(model, 0)["spec"], "signed_deltas": True}},
    )  # fmt: skip
    refusal = "signs its deltas and this device has no identity key"
    with np.load(files[0]) as data, pytest.raises(ConfigError, match=refusal):
        keyless.run(data["x"], data["y"])
