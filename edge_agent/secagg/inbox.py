"""The receiving side of the secure round engine: statuses and sealed protocol messages.

Everything a :class:`~edge_agent.secure_engine.SecureEngine` learns from the broker
comes through :class:`SecureInbox`: its correspondents' retained statuses (ready,
offline, left) and, on its own inbox topic, chunked envelopes — masked inputs
(SECURE_INPUT) for its own instance, and SECAGG bodies: sealed shares for the
:class:`~edge_agent.secagg.holder.ShareHolder`, sealed reveals for the aggregator's
:class:`~edge_agent.secagg.instance.Instance`, signed requests (declarations) to
answer. In a ``signed_deltas`` job every envelope is verified before anything reads it;
unsigned, mis-signed and replayed ones are counted in :class:`SecureStats` and dropped.
Handling runs on the engine's thread (:class:`~edge_agent.mailbox.Mailbox`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_agent.mailbox import MAX_ROUNDS_AHEAD, Mailbox
from edge_agent.secagg.holder import ShareHolder
from edge_agent.secagg.instance import Instance
from edge_agent.secagg.keyring import Keyring
from edge_agent.signing import RejectLog, ReplayWindow, Verdict, Verifier
from meshfl.contract import Declaration
from meshfl.errors import MeshflError, QuotaError, WireError
from meshfl.wire import Envelope, MessageKind, Reassembler, parse_topic
from meshfl.wire.secagg import SignedRequest, decode_body
from meshfl.wire.serde import DecodedEnvelope, decode_envelope_signed
from meshfl.wire.shares import Reveal, SharesMessage, decode_sealed
from meshfl.wire.status import decode_status

__all__ = ["KEEP_ROUNDS", "SecureInbox", "SecureStats"]

log = logging.getLogger("meshfl.agent.secure")

KEEP_ROUNDS = 4
"""Rounds of shares, instances and pending contributions kept for late messages."""


@dataclass
class SecureStats:
    """Counters of one device's secure rounds."""

    aggregated: int = 0  # own instances unmasked
    aborted: int = 0  # own instances below the threshold (nothing reconstructed)
    failed: int = 0  # own instances that could not collect enough shares in time
    late_ignored: int = 0  # masked inputs from peers already declared dropped
    refusals: int = 0  # requests for both shares of one peer, refused
    rejected: int = 0  # malformed or unverifiable messages
    committed: int = 0  # own contributions confirmed included by their aggregator
    unsigned: int = 0  # signed job: envelopes without a signature
    bad_signature: int = 0  # signed job: signature invalid, or the sender has no key
    replayed: int = 0  # signed job: a (sender, sequence) or round already used up
    rejected_reasons: list[str] = field(default_factory=list)


class SecureInbox(Mailbox):
    """What a secure engine received, handled on its own thread (see the module docstring).

    Parameters
    ----------
    fleet, job_id, device_id
        This device's job; other fleets' and jobs' messages are ignored.
    keyring
        The job's keys and verified directory (neighbourhoods, bundles).
    modulus_bits
        b of the job's fixed-point encoding: a masked input holds b-bit words.
    deadline_s
        The round deadline in seconds (chunk reassembly waits ``max(60, 4·deadline_s)``).
    verifier
        Verifies every envelope (a ``signed_deltas`` job); ``None``: unchecked.
    clock
        Monotonic clock (seconds).

    """

    logger = log

    def __init__(
        self,
        *,
        fleet: str,
        job_id: str,
        device_id: str,
        keyring: Keyring,
        modulus_bits: int,
        deadline_s: float,
        verifier: Verifier | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.fleet, self.job_id, self.device_id = fleet, job_id, device_id
        self.keyring, self.directory = keyring, keyring.directory
        self.modulus_bits = modulus_bits
        self.verifier = verifier
        self.neighbours: tuple[str, ...] = self.directory.neighbourhoods.get(device_id, ())
        # Everyone this device exchanges messages with: its neighbours and their other
        # members (shares go to co-members two hops away), waited for at the start.
        self.correspondents: frozenset[str] = frozenset(
            m for i in self.neighbours for m in (i, *self.directory.neighbourhoods.get(i, ()))
        ) - {device_id}
        self.stats = SecureStats()
        self.holder = ShareHolder(device_id)
        self._reassembler = Reassembler(timeout_s=max(60.0, 4 * deadline_s))
        self._seen: dict[str, set[int]] = {}  # sender -> sequence numbers handled
        self._window = ReplayWindow()  # signed job: sequence numbers accepted per sender
        self._refusals = RejectLog(log, clock=clock)
        self._offline: set[str] = set()
        self._ready: set[str] = set()
        self._round = 0
        self._instances: dict[int, Instance] = {}
        self._requests: list[tuple[str, Declaration]] = []  # awaiting this holder's shares
        self._future: dict[int, list[tuple[str, Envelope]]] = {}

    def _handle(self, topic: str, payload: bytes) -> None:
        try:
            info = parse_topic(topic)
            if info.kind == "status":
                self._on_status(info.device, payload)
            elif info.kind == "inbox" and info.device == self.device_id:
                message = self._reassembler.feed(payload, info.peer or "", topic)
                if message is not None:
                    decoded = decode_envelope_signed(message)
                    if self._authentic(decoded, info.peer, topic):
                        self._on_envelope(info.peer, decoded.envelope)
        except (MeshflError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._reject(f"dropped a message on {topic}: {type(exc).__name__}: {exc}")

    def _authentic(self, decoded: DecodedEnvelope, src: str | None, topic: str) -> bool:
        """Signature and replay checks of a signed job (always True without a verifier)."""
        env = decoded.envelope
        if self.verifier is None or env.fleet != self.fleet or env.job != self.job_id:
            return True  # another job's message is ignored by _on_envelope
        verdict = self.verifier.verify(decoded)
        if verdict is None and env.sender == src:
            stale = env.round + KEEP_ROUNDS < self._round
            if stale or not self._window.accept(env.sender, env.sequence):
                verdict = Verdict.REPLAYED
        if verdict is None:
            return True
        self._refusals(self.stats, verdict, env.sender, env.round, topic)
        return False

    def _on_status(self, device: str | None, payload: bytes) -> None:
        if device is None or device not in self.correspondents:
            return
        status = decode_status(payload)  # PayloadError: rejected and counted
        if status is None:  # a deleted retained status
            return
        state, job = status.state, status.job
        if state == "offline" or (state == "declined" and job == self.job_id):
            self._offline.add(device)
        elif state == "online" and job == self.job_id:
            self._offline.discard(device)
            self._ready.add(device)
        elif state == "online" and device in self._ready:
            self._offline.add(device)  # it was in this job and has left it

    def _on_envelope(self, src: str | None, env: Envelope) -> None:
        if env.fleet != self.fleet or env.job != self.job_id:
            return
        if src is None or env.sender != src or src not in self.directory.bundles:
            raise WireError(f"a secure message from {env.sender!r} on {src!r}'s inbox")
        seen = self._seen.setdefault(src, set())
        if env.sequence in seen:
            return  # a duplicate delivery
        seen.add(env.sequence)
        if env.round > self._round + MAX_ROUNDS_AHEAD:  # never held (a round near 2**32)
            raise QuotaError(f"{src}'s round {env.round} is past this device's window")
        if env.round > self._round and env.kind == MessageKind.SECURE_INPUT:
            held = self._future.setdefault(env.round, [])
            if any(s == src for s, _ in held):  # one masked input per member and round
                raise QuotaError(f"{src} already has a masked input held for round {env.round}")
            held.append((src, env))
        elif env.kind == MessageKind.SECURE_INPUT:
            self._on_input(src, env)
        elif env.kind == MessageKind.SECAGG:
            self._on_body(src, env)
        else:
            raise WireError(f"a {env.kind.name} message from {src} on a secure inbox")

    def _on_input(self, src: str, env: Envelope) -> None:
        # Addressing first: a masked input replayed to another aggregator is refused (and
        # counted) whenever it arrives, also after the round was declared or forgotten.
        if (
            len(env.tensors) != 2
            or env.tensors[0].name != f"masked:{self.device_id}"
            or env.tensors[1].name != "masked_with"
        ):
            raise WireError(f"{src}'s masked input is not addressed to this aggregator")
        instance = self._instances.get(env.round)
        if instance is None:
            return  # a round already forgotten
        n = self.keyring.input_size(env.round, self.device_id)
        bits = self.modulus_bits
        if not instance.add_input(src, env.tensors[0].payload, env.tensors[1].payload, n, bits):
            self.stats.late_ignored += 1
            log.info("round %d: ignored %s's late masked input (declared dropped)", env.round, src)

    def _on_body(self, src: str, env: Envelope) -> None:
        if len(env.tensors) != 1:
            raise WireError("a protocol message has exactly one body tensor")
        body = decode_body(env.tensors[0].payload)
        if isinstance(body, SignedRequest):
            self._requests.append((src, self.keyring.check_declaration(src, body, self.neighbours)))
            return
        message = decode_sealed(self.keyring.open(src, env.round, body.ciphertext))
        if isinstance(message, SharesMessage):
            if message.owner != src or message.round != env.round:
                raise WireError(f"{src} sent shares that name another owner or round")
            if not set(message.shares) <= set(self.neighbours):
                raise WireError(f"{src} sent shares for an aggregator that is not a neighbour")
            self.holder.store_message(message)
        else:
            reveal = message
            if reveal.aggregator != self.device_id or reveal.round != env.round:
                raise WireError(f"{src} sent a reveal for another instance")
            self._on_reveal(src, reveal)

    def _on_reveal(self, src: str, reveal: Reveal) -> None:
        instance = self._instances.get(reveal.round)
        if instance is not None:
            instance.add_reveal(src, reveal)
