"""Secure aggregation between neighbours: one device's round engine for a secure job.

Each round runs one secure-aggregation instance per (round r, aggregator i) — Bonawitz
et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017
(Figure 4), with the neighbourhood N(i) in the place of the server's users as in SecAgg+
(Bell et al., CCS 2020). This device plays three parts at once:

- **member** of every neighbour's instance: it sends each other member of N(i) its
  Shamir shares (sealed with AES-GCM under an X25519 key), then the aggregator its masked
  per-edge CHOCO-SGD contribution (:class:`~meshfl.aggregation.SecureChoco`);
- **aggregator** of its own instance: it waits for its neighbours' masked inputs (all, or
  until the deadline), has the coordinator sign the survivor set (the declaration), sends
  it to every member, collects ≥ t revealed shares per secret and unmasks the *sum*;
- **holder**: it answers each aggregator's signed request with the shares the declaration
  allows — b-shares of survivors, mask-key shares of dropouts, never both for one peer in
  one round (:class:`~edge_agent.secagg.holder.ShareHolder`).

A member commits its per-edge replica update only when the aggregator's declaration
lists it as a survivor, so every replica stays consistent through dropouts. Messages go
per edge on ``meshfl/v1/{fleet}/node/{dst}/inbox/{src}`` as chunked envelopes: masked
inputs as kind SECURE_INPUT, protocol messages as kind SECAGG (a JSON body). The protocol
and its trust assumptions are in ``docs/privacy.md``.

In a ``signed_deltas`` job every envelope is signed with the device's identity key and
verified on arrival before anything reads it (``docs/security.md``, "Signed deltas"):
unsigned, mis-signed and replayed ones (a sequence number already accepted or below the
sender's anti-replay window, :class:`~edge_agent.signing.ReplayWindow`, or a round older
than the rounds kept) are counted in
:class:`SecureStats` and dropped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from edge_agent.mailbox import MAX_ROUNDS_AHEAD, Mailbox
from edge_agent.secagg.crypto import (
    JobKeys,
    ParsedBundle,
    combine_shares,
    mask_seed,
    open_sealed,
    seal,
    seal_aad,
    share_key,
    split_secret,
    verify_signature,
)
from edge_agent.secagg.holder import ShareHolder
from edge_agent.signing import RejectLog, ReplayWindow, Verdict, Verifier
from edge_agent.transport.base import Transport
from meshfl.aggregation import (
    Contribution,
    FixedPoint,
    SecureChoco,
    add_mod,
    mask,
    pack_words,
    shared_indices,
    unmask,
    unpack_words,
)
from meshfl.contract import Declaration, SignedDeclaration
from meshfl.errors import MeshflError, QuotaError, SecurityError, WireError
from meshfl.wire import (
    DType,
    Envelope,
    MessageKind,
    Reassembler,
    TensorEntry,
    control_topic,
    inbox_filter,
    inbox_topic,
    new_message_id,
    parse_topic,
    split_message,
    status_topic,
)
from meshfl.wire.control import ControlMessage
from meshfl.wire.secagg import (
    SignedRequest,
    decode_body,
    decode_mask_set,
    encode_declaration,
    encode_mask_set,
    encode_request,
    encode_sealed,
)
from meshfl.wire.serde import DecodedEnvelope, Sign, decode_envelope_signed, encode_envelope
from meshfl.wire.shares import (
    Reveal,
    Share,
    SharesMessage,
    decode_sealed,
    encode_reveal,
    encode_shares,
)
from meshfl.wire.status import decode_status, encode_status

__all__ = ["Directory", "SecureEngine", "SecureStats"]

log = logging.getLogger("meshfl.agent.secure")

SECURE_TAG = 0
"""Codec tag of a masked input's payload (b-bit words, tightly packed) and of a body."""
_KEEP_ROUNDS = 4
"""Rounds of shares, instances and pending contributions kept for late messages."""


@dataclass(frozen=True)
class Directory:
    """The verified key directory of one job, as one device uses it.

    ``neighbourhoods`` maps every device to its sorted neighbours N(i) (a member's slot
    for aggregator i is the position of i in its own N); ``bundles`` holds every
    device's verified keys; ``coordinator_key`` (base64 Ed25519) verifies declarations.
    """

    threshold: int
    coordinator_key: str
    neighbourhoods: Mapping[str, tuple[str, ...]]
    bundles: Mapping[str, ParsedBundle]


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


@dataclass
class _Instance:
    """The aggregator's state of its own instance of one round."""

    members: tuple[str, ...]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    masked_with: dict[str, frozenset[str]] = field(default_factory=dict)  # sender -> S_j
    declaration: Declaration | None = None
    b_shares: dict[str, dict[int, bytes]] = field(default_factory=dict)
    s_shares: dict[str, dict[int, bytes]] = field(default_factory=dict)
    done: bool = False


class SecureEngine(Mailbox):
    """Run the secure rounds of one job on one device (see the module docstring).

    Parameters
    ----------
    transport
        A connected transport.
    declare
        Has the coordinator sign a :class:`~meshfl.contract.Declaration` (the REST call)
        and returns the :class:`~meshfl.contract.SignedDeclaration`.
    fleet, job_id, device_id
        This device's job.
    directory
        The verified key directory.
    keys
        This device's per-job keys (one masking key per round and aggregator slot).
    algorithm
        The per-edge CHOCO-SGD state.
    fixed_point
        The job's fixed-point encoding (range, bits, modulus).
    density
        Shared-seed random-k density (1.0: dense).
    deadline_s
        Seconds the aggregator waits for masked inputs; unmasking gets as long again.
    max_payload
        Chunk size limit of an MQTT payload (bytes); the broker's limit where smaller.
    rng
        Stochastic rounding and DP noise (masks and self-mask seeds use OS entropy).
    signer, verifier
        Sign every envelope sent / verify every one received (a ``signed_deltas`` job);
        ``None`` (default): unsigned, unchecked.

    """

    logger = log

    def __init__(
        self,
        *,
        transport: Transport,
        declare: Callable[[Declaration], SignedDeclaration],
        fleet: str,
        job_id: str,
        device_id: str,
        directory: Directory,
        keys: JobKeys,
        algorithm: SecureChoco,
        fixed_point: FixedPoint,
        density: float,
        deadline_s: float,
        max_payload: int,
        rng: np.random.Generator,
        clock: Callable[[], float] = time.monotonic,
        signer: Sign | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.transport = transport
        self.signer, self.verifier = signer, verifier
        self.declare = declare
        self.fleet, self.job_id, self.device_id = fleet, job_id, device_id
        self.directory = directory
        self.keys = keys
        self.algorithm = algorithm
        self.fixed_point = fixed_point
        self.density = density
        self.deadline_s = deadline_s
        self.max_payload = max_payload
        self.rng = rng
        super().__init__(clock)
        self.threshold = directory.threshold
        self.neighbours: tuple[str, ...] = directory.neighbourhoods.get(device_id, ())
        # Everyone this device exchanges messages with: its neighbours and their other
        # members (shares go to co-members two hops away), waited for at the start.
        self.correspondents: frozenset[str] = frozenset(
            m for i in self.neighbours for m in (i, *directory.neighbourhoods.get(i, ()))
        ) - {device_id}
        self.stats = SecureStats()
        self.holder = ShareHolder(device_id)
        self.control: list[ControlMessage] = []  # the job runner reads it like GossipEngine's
        self._reassembler = Reassembler(timeout_s=max(60.0, 4 * deadline_s))
        self._sequence = 0
        self._seen: dict[str, set[int]] = {}  # sender -> sequence numbers handled
        self._window = ReplayWindow()  # signed job: sequence numbers accepted per sender
        self._refusals = RejectLog(log, clock=clock)
        self._offline: set[str] = set()
        self._ready: set[str] = set()
        self._round = 0
        self._started_at: dict[int, float] = {}
        self._instances: dict[int, _Instance] = {}
        self._pending: dict[tuple[int, str], Contribution] = {}
        self._answered: dict[int, set[str]] = {}  # round -> aggregators answered
        self._requests: list[tuple[str, Declaration]] = []  # awaiting this holder's shares
        self._future: dict[int, list[tuple[str, Envelope]]] = {}
        self._share_keys: dict[str, bytes] = {}
        self._self_seeds: dict[str, bytes] = {}  # this round's b seed per aggregator
        self._request_arrival: dict[tuple[int, str], float] = {}

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to this device's inbox, its neighbours' statuses and the control topic."""
        self.transport.set_handler(self._on_message)
        self.transport.subscribe(control_topic(self.fleet), qos=1)
        self.transport.subscribe(inbox_filter(self.fleet, self.device_id), qos=1)
        for peer in sorted(self.correspondents):
            self.transport.subscribe(status_topic(self.fleet, peer), qos=1)
        self._status(encode_status("online", self.job_id, 0))

    def wait_ready(self, timeout_s: float) -> list[str]:
        """Wait until every correspondent announced this job (or is offline).

        A device announces the job only once its inbox subscription is acknowledged, so
        after this barrier no share sent to a co-member two hops away is lost. Returns
        the sorted ids of those still absent after ``timeout_s`` seconds.
        """
        deadline = self.clock() + timeout_s
        while not all(p in self._ready or p in self._offline for p in self.correspondents):
            if not self._wait_one(deadline):
                break
        return sorted(self.correspondents - self._ready - self._offline)

    def leave(self) -> None:
        """Announce that this device left the job."""
        self._status(encode_status("online"))

    def _status(self, payload: bytes) -> None:
        topic = status_topic(self.fleet, self.device_id)
        self.transport.publish(topic, payload, qos=1, retain=True)

    # -- one round --------------------------------------------------------------------

    def exchange(
        self, round_: int, x: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Run round ``round_``: shares and masked inputs out, aggregate, answer, mix.

        Returns the model after the consensus step and the sorted neighbours whose input
        is not in this device's sum (the dropped ones; all of them when the round aborted
        or could not be unmasked in time).
        """
        self._round = round_
        self._started_at[round_] = self.clock()
        instance = self._instances.setdefault(round_, _Instance(self.neighbours))
        self._send_shares(round_)
        self._await_shares(round_, self.clock() + self.deadline_s)
        self._send_inputs(round_, x)
        for src, env in self._future.pop(round_, []):  # inputs that came early (deduplicated)
            self._on_input(src, env)
        collect_until = self.clock() + self.deadline_s
        hard_stop = collect_until + self.deadline_s
        while True:
            self._serve_requests()
            if instance.declaration is None and (
                self._all_inputs(instance) or self.clock() >= collect_until
            ):
                self._declare(round_, instance)
            if instance.declaration is not None and not instance.done:
                self._try_unmask(round_, instance)
            if instance.done and self._answered_all(round_):
                break
            if not self._wait_one(hard_stop):
                break
        self._serve_requests()
        if not instance.done:
            self.stats.failed += 1
            log.warning("round %d: could not unmask the neighbourhood sum in time", round_)
        missing = self._missing(instance)
        self._forget(round_)
        return self.algorithm.mix(x), missing

    def drain(self, timeout_s: float = 0.0) -> None:
        """Handle what arrives within ``timeout_s`` seconds (late inputs, requests)."""
        deadline = self.clock() + timeout_s
        while self._wait_one(deadline):
            pass
        self._drain_queue()
        self._serve_requests()

    def _missing(self, instance: _Instance) -> list[str]:
        declaration = instance.declaration
        if declaration is None or declaration["aborted"] or not instance.done:
            return sorted(self.neighbours)
        return sorted(set(self.neighbours) - set(declaration["survivors"]))

    def _all_inputs(self, instance: _Instance) -> bool:
        return set(instance.members) - self._offline <= set(instance.inputs)

    def _answered_all(self, round_: int) -> bool:
        answered = self._answered.get(round_, set())
        return all(p in answered or p in self._offline for p in self.neighbours)

    # -- member: shares and masked inputs ---------------------------------------------

    def _send_shares(self, round_: int) -> None:
        """Draw this round's self-mask seeds; send every co-member its sealed shares.

        Shares go first: a member masks only with the co-members whose shares it holds
        (Bonawitz et al.'s U1), so a device that died before this round is left out of
        every mask instead of making the neighbourhood sum unrecoverable.
        """
        shares_for: dict[str, dict[str, tuple[Share, Share]]] = {}
        self._self_seeds = {}
        for slot, aggregator in enumerate(self.neighbours):
            members = self.directory.neighbourhoods[aggregator]
            self_seed = os.urandom(32)
            self._self_seeds[aggregator] = self_seed
            b_split = split_secret(self_seed, self.threshold, len(members))
            s_split = split_secret(
                self.keys.s_private_raw(round_, slot), self.threshold, len(members)
            )
            for position, member in enumerate(members):
                pair = (b_split[position], s_split[position])
                if member == self.device_id:
                    self.holder.store(self.device_id, round_, aggregator, *pair)
                else:
                    shares_for.setdefault(member, {})[aggregator] = pair
        for member, shares in sorted(shares_for.items()):
            message = SharesMessage(self.device_id, round_, shares)
            self._send_sealed(member, round_, encode_shares(message))

    def _await_shares(self, round_: int, deadline: float) -> None:
        """Wait until every live co-member's shares of this round are here (or ``deadline``)."""

        def waiting() -> bool:
            for aggregator in self.neighbours:
                members = self.directory.neighbourhoods[aggregator]
                alive = [m for m in members if m not in self._offline]
                if self.holder.missing(round_, aggregator, alive):
                    return True
            return False

        while waiting():
            self._serve_requests()
            if not self._wait_one(deadline):
                return

    def _send_inputs(self, round_: int, x: Mapping[str, np.ndarray]) -> None:
        """A masked contribution to every neighbour, masked with the co-members heard from."""
        bits = self.fixed_point.modulus_bits
        for slot, aggregator in enumerate(self.neighbours):
            members = self.directory.neighbourhoods[aggregator]
            s_private = self.keys.s_private_raw(round_, slot)
            others = [m for m in members if m != self.device_id]
            masked_with = sorted(
                m for m in others if not self.holder.missing(round_, aggregator, [m])
            )
            contribution = self.algorithm.contribution(
                x, aggregator, self._index_seed(round_, aggregator), self.rng
            )
            self._pending[(round_, aggregator)] = contribution
            pairwise = [
                (self._mask_seed(s_private, member, round_, aggregator), self._sign(member))
                for member in masked_with
            ]
            masked = mask(contribution.encoded, self._self_seeds[aggregator], pairwise, bits)
            words = TensorEntry(
                f"masked:{aggregator}",  # bound to its aggregator: a replay elsewhere is refused
                (len(masked),),
                DType.UINT8,
                SECURE_TAG,
                pack_words(masked, bits),
            )
            listed = encode_mask_set(masked_with)
            peers = TensorEntry("masked_with", (len(listed),), DType.UINT8, SECURE_TAG, listed)
            self._send(aggregator, MessageKind.SECURE_INPUT, round_, (words, peers))

    def _sign(self, other: str) -> int:
        return 1 if self.device_id < other else -1

    def _index_seed(self, round_: int, aggregator: str) -> bytes:
        text = f"meshfl randk|{self.job_id}|{round_}|{aggregator}"
        return hashlib.sha256(text.encode()).digest()

    def _indices(self, round_: int, aggregator: str) -> np.ndarray | None:
        """The shared-seed random-k coordinates of instance (round, aggregator); None: dense."""
        if self.density >= 1.0:
            return None
        n = self.algorithm.flat_size
        return shared_indices(self._index_seed(round_, aggregator), n, self.algorithm.index_count)

    def _mask_seed(self, s_private: bytes, other: str, round_: int, aggregator: str) -> bytes:
        """m_{self,other} of instance (round, aggregator), from this side's private key."""
        return mask_seed(
            s_private,
            self._s_public(other, round_, aggregator),
            self.job_id,
            round_,
            aggregator,
            self.device_id,
            other,
        )

    def _s_public(self, member: str, round_: int, aggregator: str) -> bytes:
        """``member``'s masking public key for instance (round, aggregator)."""
        slot = self.directory.neighbourhoods[member].index(aggregator)
        return self.directory.bundles[member].s_pk(round_, slot)

    # -- messages ---------------------------------------------------------------------

    def _send(
        self, dst: str, kind: MessageKind, round_: int, tensors: tuple[TensorEntry, ...]
    ) -> None:
        self._sequence += 1
        env = Envelope(
            kind=kind,
            fleet=self.fleet,
            job=self.job_id,
            round=round_,
            sender=self.device_id,
            message_id=new_message_id(),
            sequence=self._sequence,
            tensors=tensors,
        )
        topic = inbox_topic(self.fleet, dst, self.device_id)
        message = encode_envelope(env, self.signer)
        size = self.transport.chunk_size(topic, self.max_payload)  # the broker may allow less
        for chunk in split_message(message, env.message_id, size):
            self.transport.publish(topic, chunk, qos=1)

    def _send_body(self, dst: str, round_: int, data: bytes) -> None:
        entry = TensorEntry("body", (len(data),), DType.UINT8, SECURE_TAG, data)
        self._send(dst, MessageKind.SECAGG, round_, (entry,))

    def _send_sealed(self, dst: str, round_: int, plaintext: bytes) -> None:
        aad = seal_aad(self.job_id, round_, self.device_id, dst)
        self._send_body(dst, round_, encode_sealed(seal(self._key_for(dst), plaintext, aad)))

    def _key_for(self, peer: str) -> bytes:
        key = self._share_keys.get(peer)
        if key is None:
            key = share_key(self.keys.c_private, self.directory.bundles[peer].c_pk)
            self._share_keys[peer] = key
        return key

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
            stale = env.round + _KEEP_ROUNDS < self._round
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
        if src not in instance.members:
            raise WireError(f"{src} is not in this device's neighbourhood")
        if instance.declaration is not None:
            if src in instance.declaration["dropped"]:
                self.stats.late_ignored += 1
                log.info("round %d: ignored %s's late masked input (declared dropped)",
                         env.round, src)  # fmt: skip
            return
        if src in instance.inputs:
            raise WireError(f"{src} sent a second masked input for round {env.round}")
        masked_with = decode_mask_set(env.tensors[1].payload)
        if not set(masked_with) <= set(instance.members):
            raise WireError(f"{src}'s mask set is not a subset of this neighbourhood")
        indices = self._indices(env.round, self.device_id)
        n = self.algorithm.flat_size if indices is None else len(indices)
        bits = self.fixed_point.modulus_bits
        instance.inputs[src] = unpack_words(env.tensors[0].payload, n, bits)
        instance.masked_with[src] = frozenset(masked_with) - {src}

    def _on_body(self, src: str, env: Envelope) -> None:
        if len(env.tensors) != 1:
            raise WireError("a protocol message has exactly one body tensor")
        body = decode_body(env.tensors[0].payload)
        if isinstance(body, SignedRequest):
            self._requests.append((src, self._check_declaration(src, body)))
            return
        aad = seal_aad(self.job_id, env.round, src, self.device_id)
        message = decode_sealed(open_sealed(self._key_for(src), body.ciphertext, aad))
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

    def _check_declaration(self, src: str, request: SignedRequest) -> Declaration:
        """The declaration of a REQUEST, verified against the coordinator's key."""
        declaration = request.declaration
        verify_signature(
            self.directory.coordinator_key, encode_declaration(declaration), request.signature
        )
        if (
            declaration["aggregator"] != src
            or declaration["job"] != self.job_id
            or src not in self.neighbours
        ):
            raise SecurityError(f"{src} forwarded a declaration that is not its own")
        return declaration

    # -- holder -----------------------------------------------------------------------

    def _serve_requests(self) -> None:
        """Answer aggregators' requests; one whose shares are not all here yet waits."""
        waiting: list[tuple[str, Declaration]] = []
        for src, declaration in self._requests:
            round_ = declaration["round"]
            survivors, dropped = declaration["survivors"], declaration["dropped"]
            if not declaration["aborted"]:
                if self.device_id in survivors:
                    self._commit(round_, src)
                late = self.clock() >= self._request_deadline(round_, src)
                if self.holder.missing(round_, src, survivors, dropped) and not late:
                    waiting.append((src, declaration))  # shares may still be on their way
                    continue
                reveal = self.holder.reveal(round_, src, survivors, dropped)
                self.stats.refusals = self.holder.refusals
                self._send_sealed(src, round_, encode_reveal(reveal))
            self._answered.setdefault(round_, set()).add(src)
        self._requests = waiting

    def _request_deadline(self, round_: int, aggregator: str) -> float:
        """Until when a request may wait for shares still on their way.

        Shares are sent before the inputs, so a few seconds at most: 5 s after it came.
        """
        arrived: float = self._request_arrival.setdefault((round_, aggregator), self.clock())
        return arrived + min(5.0, self.deadline_s)

    def _commit(self, round_: int, aggregator: str) -> None:
        """The aggregator confirmed this device's input: update the edge's replica."""
        contribution = self._pending.pop((round_, aggregator), None)
        if contribution is not None:
            self.algorithm.commit(contribution)
            self.stats.committed += 1

    # -- aggregator -------------------------------------------------------------------

    def _declare(self, round_: int, instance: _Instance) -> None:
        survivors = sorted(instance.inputs)
        alive = set(survivors)
        # Members some survivor masked with but that sent no input: their masks must go.
        dropped = sorted(set().union(*instance.masked_with.values()) - alive)
        # Masks between two survivors cancel only if each masked with the other.
        lopsided = sorted(
            f"{j}/{k}"
            for j in survivors
            for k in instance.masked_with[j] & alive
            if j not in instance.masked_with[k]
        )
        if lopsided:
            log.warning(
                "round %d: survivors %s masked with each other one-sidedly (a member crashed"
                " while sending shares): round aborted",
                round_,
                lopsided,
            )
        declaration: Declaration = {
            "job": self.job_id,
            "round": round_,
            "aggregator": self.device_id,
            "survivors": survivors,
            "dropped": dropped,
            "aborted": len(survivors) < self.threshold or bool(lopsided),
        }
        try:
            signed = self.declare(declaration)
        except MeshflError as exc:  # retried on the next pass until the round's hard stop
            log.warning("round %d: the coordinator did not sign the declaration: %s", round_, exc)
            return
        instance.declaration = signed["declaration"]
        dropped = instance.declaration["dropped"]
        if dropped:
            log.info("round %d: %s dropped out of this neighbourhood", round_, ", ".join(dropped))
        for member in instance.members:
            body = encode_request(signed["declaration"], signed["signature"])
            self._send_body(member, round_, body)
        if instance.declaration["aborted"]:
            self.stats.aborted += 1
            instance.done = True
            log.warning(
                "round %d: %d of %d neighbours delivered, below the threshold %d: round"
                " aborted, nothing reconstructed",
                round_,
                len(survivors),
                len(instance.members),
                self.threshold,
            )

    def _on_reveal(self, src: str, reveal: Reveal) -> None:
        instance = self._instances.get(reveal.round)
        if instance is None or instance.declaration is None or instance.done:
            return
        if src not in instance.members:
            raise WireError(f"{src} is not a member of this neighbourhood")
        for owner, share in reveal.b_shares.items():
            if owner in instance.declaration["survivors"]:
                instance.b_shares.setdefault(owner, {})[share[0]] = share[1]
        for owner, share in reveal.s_shares.items():
            if owner in instance.declaration["dropped"]:
                instance.s_shares.setdefault(owner, {})[share[0]] = share[1]

    def _try_unmask(self, round_: int, instance: _Instance) -> None:
        """With t shares of every needed secret: remove the masks, absorb the sum."""
        declaration = instance.declaration
        assert declaration is not None
        survivors, dropped, t = declaration["survivors"], declaration["dropped"], self.threshold
        if any(len(instance.b_shares.get(j, {})) < t for j in survivors) or any(
            len(instance.s_shares.get(j, {})) < t for j in dropped
        ):
            return
        self_seeds = [combine_shares(sorted(instance.b_shares[j].items())[:t]) for j in survivors]
        pairwise: list[tuple[bytes, int]] = []
        for k in dropped:  # each survivor j that masked with k added sign(j, k)·PRG(m_jk)
            s_private = combine_shares(sorted(instance.s_shares[k].items())[:t])
            for j in survivors:
                if k in instance.masked_with[j]:
                    seed = mask_seed(
                        s_private, self._s_public(j, round_, self.device_id), self.job_id,
                        round_, self.device_id, k, j,
                    )  # fmt: skip
                    pairwise.append((seed, 1 if j < k else -1))
        bits = self.fixed_point.modulus_bits
        total = add_mod([instance.inputs[j] for j in survivors], bits)
        plain = unmask(total, self_seeds, pairwise, bits)
        n = len(survivors)
        bound = n * self.fixed_point.level + 8 * self.algorithm.noise_std * n**0.5
        if np.abs(self.fixed_point.to_signed(plain)).max(initial=0) > bound:
            # A wrong share or a tampered input leaves uniform garbage, far outside the
            # range a true sum can take: never mix it in.
            log.warning("round %d: the unmasked sum is out of range (a wrong share or input);"
                        " not mixed", round_)  # fmt: skip
            self.stats.failed += 1
            instance.done = True
            return
        try:
            self.algorithm.absorb(
                self.fixed_point.decode(plain), self._indices(round_, self.device_id)
            )
        except MeshflError as exc:  # a wrong share gives garbage: keep the state, skip the sum
            log.warning("round %d: the unmasked sum was refused (%s); not mixed", round_, exc)
            self.stats.failed += 1
        else:
            self.stats.aggregated += 1
        instance.done = True

    def _forget(self, round_: int) -> None:
        old = round_ - _KEEP_ROUNDS
        for key in [k for k in self._pending if k[0] <= old]:
            del self._pending[key]
        for r in [r for r in self._instances if r <= old]:
            del self._instances[r]
        for r in [r for r in self._answered if r <= old]:
            del self._answered[r]
        for r in [r for r in self._started_at if r <= old]:
            del self._started_at[r]
        for seen in self._seen.values():  # bound memory: keep the latest sequence numbers
            if len(seen) > 50_000:
                newest = max(seen)
                seen.intersection_update(range(newest - 25_000, newest + 1))
        self.holder.forget_before(old + 1)
