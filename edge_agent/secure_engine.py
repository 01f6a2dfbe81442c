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

It is a job's :class:`~edge_agent.round_engine.RoundEngine`; its parts are in
:mod:`edge_agent.secagg`: ``inbox`` (what arrives), ``instance`` (the aggregator's
round), ``keyring`` (keys, sealing, mask seeds), ``holder`` (the shares held).

In a ``signed_deltas`` job every envelope is signed with the device's identity key and
verified on arrival before anything reads it (``docs/security.md``, "Signed deltas"):
unsigned, mis-signed and replayed ones (a sequence number already accepted or below the
sender's anti-replay window, :class:`~edge_agent.signing.ReplayWindow`, or a round older
than the rounds kept) are counted in
:class:`~edge_agent.secagg.inbox.SecureStats` and dropped (:mod:`edge_agent.secagg.inbox`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.round_engine import RoundHooks, wait_at_start_barrier
from edge_agent.secagg.crypto import JobKeys
from edge_agent.secagg.inbox import KEEP_ROUNDS, SecureInbox
from edge_agent.secagg.instance import Instance
from edge_agent.secagg.keyring import Directory, Keyring
from edge_agent.secagg.shamir import split_secret
from edge_agent.signing import Verifier
from edge_agent.transport.base import Transport
from meshfl.aggregation import (
    Contribution,
    FixedPoint,
    SecureChoco,
    mask,
    pack_words,
)
from meshfl.contract import Declaration, SignedDeclaration
from meshfl.errors import MeshflError
from meshfl.wire import (
    DType,
    Envelope,
    MessageKind,
    TensorEntry,
    control_topic,
    inbox_filter,
    inbox_topic,
    new_message_id,
    pack_message,
    status_topic,
)
from meshfl.wire.secagg import (
    encode_mask_set,
    encode_request,
    encode_sealed,
)
from meshfl.wire.serde import Sign
from meshfl.wire.shares import (
    Share,
    SharesMessage,
    encode_reveal,
    encode_shares,
)
from meshfl.wire.status import encode_status

if TYPE_CHECKING:
    from edge_agent.trainer import Trainer

__all__ = ["SecureEngine"]

log = logging.getLogger("meshfl.agent.secure")

SECURE_TAG = 0
"""Codec tag of a masked input's payload (b-bit words, tightly packed) and of a body."""


class SecureEngine(SecureInbox, RoundHooks):
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
        keyring = Keyring(
            directory, keys, job_id, device_id, density, algorithm.flat_size, algorithm.index_count
        )
        super().__init__(
            fleet=fleet,
            job_id=job_id,
            device_id=device_id,
            keyring=keyring,
            modulus_bits=fixed_point.modulus_bits,
            deadline_s=deadline_s,
            verifier=verifier,
            clock=clock,
        )
        self.transport = transport
        self.signer = signer
        self.declare = declare
        self.keys = keys
        self.algorithm = algorithm
        self.fixed_point = fixed_point
        self.deadline_s = deadline_s
        self.max_payload = max_payload
        self.rng = rng
        self.threshold = directory.threshold
        self._sequence = 0
        self._pending: dict[tuple[int, str], Contribution] = {}
        self._answered: dict[int, set[str]] = {}  # round -> aggregators answered
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

    def prepare(self, start_round: int, trainer: Trainer) -> int:
        """The start barrier (:meth:`wait_ready`); returns ``start_round``.

        A secure job has no joiners' catch-up and no checkpoints: every round needs
        every member's keys and shares from the job's start.
        """
        wait_at_start_barrier(self.wait_ready, self.deadline_s)
        return start_round

    def leave(self) -> None:
        """Announce that this device left the job."""
        self._status(encode_status("online"))

    def _status(self, payload: bytes) -> None:
        topic = status_topic(self.fleet, self.device_id)
        self.transport.publish(topic, payload, qos=1, retain=True)

    # -- one round --------------------------------------------------------------------

    def exchange(
        self, round_: int, x: Mapping[str, np.ndarray], no_wait: Collection[str] = ()
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Run round ``round_``: shares and masked inputs out, aggregate, answer, mix.

        Returns the model after the consensus step and the sorted neighbours whose input
        is not in this device's sum (the dropped ones; all of them when the round aborted
        or could not be unmasked in time). ``no_wait`` is ignored: an aggregator waits
        for every member's masked input until the deadline.
        """
        self._round = round_
        instance = self._instances.setdefault(round_, Instance(self.neighbours))
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
                instance.complete(self._offline) or self.clock() >= collect_until
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
        missing = instance.missing(self.neighbours)
        self._forget(round_)
        return self.algorithm.mix(x), missing

    def drain(self, timeout_s: float = 0.0) -> None:
        """Handle what arrives within ``timeout_s`` seconds (late inputs, requests)."""
        deadline = self.clock() + timeout_s
        while self._wait_one(deadline):
            pass
        self._drain_queue()
        self._serve_requests()

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
                x, aggregator, self.keyring.index_seed(round_, aggregator), self.rng
            )
            self._pending[(round_, aggregator)] = contribution
            pairwise = [
                (
                    self.keyring.mask_seed(s_private, self.device_id, member, round_, aggregator),
                    1 if self.device_id < member else -1,
                )
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
        size = self.transport.chunk_size(topic, self.max_payload)  # the broker may allow less
        for chunk in pack_message(env, size, self.signer):
            self.transport.publish(topic, chunk, qos=1)

    def _send_body(self, dst: str, round_: int, data: bytes) -> None:
        entry = TensorEntry("body", (len(data),), DType.UINT8, SECURE_TAG, data)
        self._send(dst, MessageKind.SECAGG, round_, (entry,))

    def _send_sealed(self, dst: str, round_: int, plaintext: bytes) -> None:
        self._send_body(dst, round_, encode_sealed(self.keyring.seal(dst, round_, plaintext)))

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

    def _declare(self, round_: int, instance: Instance) -> None:
        declaration = instance.propose(self.job_id, round_, self.device_id, self.threshold)
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
                len(instance.declaration["survivors"]),
                len(instance.members),
                self.threshold,
            )

    def _try_unmask(self, round_: int, instance: Instance) -> None:
        """With t shares of every needed secret: remove the masks, absorb the sum."""
        declaration = instance.declaration
        assert declaration is not None

        def pair_seed(s_private: bytes, dropped: str, survivor: str) -> bytes:
            return self.keyring.mask_seed(s_private, dropped, survivor, round_, self.device_id)

        plain = instance.unmask(self.threshold, pair_seed, self.fixed_point.modulus_bits)
        if plain is None:
            return
        n = len(declaration["survivors"])
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
                self.fixed_point.decode(plain), self.keyring.indices(round_, self.device_id)
            )
        except MeshflError as exc:  # a wrong share gives garbage: keep the state, skip the sum
            log.warning("round %d: the unmasked sum was refused (%s); not mixed", round_, exc)
            self.stats.failed += 1
        else:
            self.stats.aggregated += 1
        instance.done = True

    def _forget(self, round_: int) -> None:
        old = round_ - KEEP_ROUNDS
        for key in [k for k in self._pending if k[0] <= old]:
            del self._pending[key]
        for r in [r for r in self._instances if r <= old]:
            del self._instances[r]
        for r in [r for r in self._answered if r <= old]:
            del self._answered[r]
        for seen in self._seen.values():  # bound memory: keep the latest sequence numbers
            if len(seen) > 50_000:
                newest = max(seen)
                seen.intersection_update(range(newest - 25_000, newest + 1))
        self.holder.forget_before(old + 1)
