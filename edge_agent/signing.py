"""Signed deltas: the agent signs every envelope it publishes and verifies its peers'.

Every device has an Ed25519 identity key (:class:`~edge_agent.secagg.crypto.IdentityKey`,
registered at enrolment); the coordinator hands each participant the public keys of the
job's devices (``Assignment.peer_keys``). A job with ``signed_deltas`` (the default) has
each envelope signed by its sender (:class:`Signer`, flag ``SIGNED`` of wire v1,
``docs/wire.md``); receivers check the signature against the key registered for the
envelope's ``sender`` (:class:`Verifier`) before anything else reads the payload, so a
spoofed sender is rejected even behind a broker that lets everything through.

:class:`ReplayWindow` decides which validly signed sequence numbers are replays (the one
place that does, for the gossip inbox and the secure-aggregation engine); :class:`Verdict`
names why a message was refused; :class:`RejectLog` logs those refusals rate-limited
(never key material). ``docs/security.md`` ("Signed deltas") has the picture.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable, Mapping
from enum import Enum

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge_agent.secagg.crypto import KEY_BYTES, SIGNATURE_BYTES, IdentityKey
from meshfl.wire.serde import DecodedEnvelope

__all__ = ["REPLAY_WINDOW", "RejectLog", "ReplayWindow", "Signer", "Verdict", "Verifier"]

log = logging.getLogger("meshfl.agent.signing")

REPLAY_WINDOW = 64
"""Sequence numbers below a sender's highest one that may still arrive (reordered)."""


class Verdict(Enum):
    """Why a received envelope was refused; the value names its counter in the stats."""

    UNSIGNED = "unsigned"
    """No signature in a signed job."""
    BAD_SIGNATURE = "bad_signature"
    """The signature does not verify with the sender's key, or the sender has no key."""
    REPLAYED = "replayed"
    """Validly signed, but its (sender, sequence) or its round was already used up."""


class Signer:
    """Signs this device's envelopes with its identity key.

    Parameters
    ----------
    identity : IdentityKey
        The device's enrolled Ed25519 key pair.

    """

    __slots__ = ("_identity",)

    def __init__(self, identity: IdentityKey) -> None:
        self._identity = identity

    def __call__(self, data: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of ``data`` (a ``meshfl.wire.serde.Sign``)."""
        return self._identity.sign(data)


class Verifier:
    """Checks peers' signatures against the keys the coordinator registered for them.

    Parameters
    ----------
    peer_keys : mapping of str to str
        Device id → Ed25519 public key (raw 32 bytes, standard base64), as in
        ``Assignment.peer_keys``. A key that does not decode is treated as absent (its
        device's messages fail verification) and logged once.

    Notes
    -----
    Public key objects are parsed once and cached; :meth:`update` adds the keys of
    devices that joined later (the agent re-reads its assignment every round).

    """

    def __init__(self, peer_keys: Mapping[str, str]) -> None:
        self._keys: dict[str, Ed25519PublicKey | None] = {}
        self._text: dict[str, str] = {}
        self.update(peer_keys)

    def update(self, peer_keys: Mapping[str, str]) -> None:
        """Add or replace devices' keys (an unchanged key keeps its cached object)."""
        for device, text in peer_keys.items():
            if self._text.get(device) == text:
                continue
            self._text[device] = text
            self._keys[device] = _public_key(device, text)

    def has_key(self, device: str) -> bool:
        """Whether a usable key is registered for ``device``."""
        return self._keys.get(device) is not None

    def verify(self, decoded: DecodedEnvelope) -> Verdict | None:
        """Check a decoded envelope's signature against its sender's key.

        Returns
        -------
        Verdict or None
            ``None`` if the signature verifies; :attr:`Verdict.UNSIGNED` if it has none;
            :attr:`Verdict.BAD_SIGNATURE` if it does not verify or the sender has no key.

        """
        if decoded.signature is None:
            return Verdict.UNSIGNED
        key = self._keys.get(decoded.envelope.sender)
        if key is None or len(decoded.signature) != SIGNATURE_BYTES:
            return Verdict.BAD_SIGNATURE
        try:
            key.verify(decoded.signature, decoded.signed_bytes)
        except InvalidSignature:
            return Verdict.BAD_SIGNATURE
        return None


class ReplayWindow:
    """Sliding anti-replay windows, one per sender (RFC 4303 §3.4.3, IPsec ESP).

    For each sender it keeps the highest sequence number accepted and a bitmap of which
    of the ``size`` numbers at and below it were accepted. A number above the highest
    is accepted and slides the window; an unseen number inside the window is accepted
    (a message that was overtaken on the way); a number already accepted, or one below
    the window, is a replay. Memory: one integer of ``size`` bits per sender, whatever
    the numbers a sender claims.

    Parameters
    ----------
    size : int
        Window width W in sequence numbers (default :data:`REPLAY_WINDOW`, 64 — RFC
        4303's recommended minimum is 32).

    Raises
    ------
    ValueError
        If ``size`` is below 1.

    """

    __slots__ = ("_high", "_mask", "_seen", "size")

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"replay window size must be >= 1, got {size}")
        self.size = size
        self._mask = (1 << size) - 1
        self._high: dict[str, int] = {}
        self._seen: dict[str, int] = {}  # bit k: high - k was accepted

    def knows(self, sender: str) -> bool:
        """Whether any sequence number of ``sender`` was accepted yet."""
        return sender in self._high

    def accept(self, sender: str, sequence: int) -> bool:
        """Accept ``(sender, sequence)`` once: True (and remembered) or False (a replay)."""
        high = self._high.get(sender)
        if high is None or sequence > high:
            shift = sequence - high if high is not None else self.size
            bits = self._seen.get(sender, 0) << shift if shift < self.size else 0
            self._high[sender], self._seen[sender] = sequence, (bits | 1) & self._mask
            return True
        back = high - sequence
        if back >= self.size or self._seen[sender] >> back & 1:
            return False
        self._seen[sender] |= 1 << back
        return True


def _public_key(device: str, text: str) -> Ed25519PublicKey | None:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        if len(raw) != KEY_BYTES:
            raise ValueError(f"{len(raw)} bytes")
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, UnicodeEncodeError, ValueError, AttributeError):
        log.warning(
            "the coordinator's identity key for %s is not a base64 Ed25519 key; its"
            " messages will be refused",
            device,
        )
        return None


class RejectLog:
    """Counts refused messages and logs them at most once per ``interval_s`` s per verdict.

    The first refusal of a kind is logged at once; later ones are counted and summed up
    in the next line ("… and N more since"). Lines name the sender and round, never a key
    or a signature.

    Parameters
    ----------
    logger : logging.Logger
        Where the warnings go.
    interval_s : float
        Seconds between two lines of one verdict (default 10).
    clock : callable
        Monotonic clock, seconds.

    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._last: dict[Verdict, float] = {}
        self._suppressed: dict[Verdict, int] = {}

    def __call__(
        self, stats: object, verdict: Verdict, sender: str, round_: int, topic: str
    ) -> None:
        """Count one refused message in ``stats.<verdict.value>`` and log it (rate-limited)."""
        setattr(stats, verdict.value, getattr(stats, verdict.value) + 1)
        now = self.clock()
        last = self._last.get(verdict)
        if last is not None and now - last < self.interval_s:
            self._suppressed[verdict] = self._suppressed.get(verdict, 0) + 1
            return
        more = self._suppressed.pop(verdict, 0)
        self._last[verdict] = now
        self.logger.warning(
            "refused a %s message claiming to be %r's round %d on %s%s",
            verdict.value.replace("_", " "),
            sender,
            round_,
            topic,
            f" (and {more} more since)" if more else "",
        )
