"""The meshfl exception tree.

Every error meshfl raises on purpose derives from :class:`MeshflError`; third-party
errors (paho return codes, httpx transport errors, SQLAlchemy integrity errors) are
translated into this tree at the one place that talks to the library::

    MeshflError
    ├── ConfigError            bad user input: options, files, specs (exit code 2)
    │   ├── DataError          a missing, empty or malformed data file, wrong shape
    │   └── CodecSpecError     an invalid codec spec string
    ├── WireError              bytes that are not a valid meshfl message
    │   ├── ChecksumError      a chunk or envelope whose CRC-32 does not match
    │   ├── VersionError       a wire version this build does not speak
    │   ├── PayloadError       a JSON payload (status, control, repair, secure aggregation)
    │   │                      that is too large, too deep, not JSON or not the right shape
    │   └── QuotaError         a well-formed message refused by a bound (round window,
    │                          the sender's quota, a full receive queue)
    ├── CodecError             a tensor that cannot be encoded/decoded (NaN, inf, bad payload)
    ├── TopologyError          a graph or mixing matrix that violates an invariant
    ├── TransportError         the broker cannot be reached or refused us (transient or not)
    │   └── BrokerUnreachable  the broker did not answer at all
    ├── CoordinatorError       the coordinator refused a request or cannot be reached
    │   └── CoordinatorUnreachable
    ├── SecurityError          a bad signature or key, or a tampered sealed message
    └── Interrupted            the user pressed Ctrl-C; cleanup is done (exit code 130)

The CLI prints ``str(error)`` as one line and exits non-zero; it never shows a
traceback for a :class:`MeshflError`.
"""

from __future__ import annotations

__all__ = [
    "BrokerUnreachable",
    "ChecksumError",
    "CodecError",
    "CodecSpecError",
    "ConfigError",
    "CoordinatorError",
    "CoordinatorUnreachable",
    "DataError",
    "Interrupted",
    "MeshflError",
    "PayloadError",
    "QuotaError",
    "SecurityError",
    "TopologyError",
    "TransportError",
    "VersionError",
    "WireError",
]


class MeshflError(Exception):
    """Base class of every error meshfl raises on purpose."""

    exit_code: int = 1


class ConfigError(MeshflError):
    """Bad user input: an option, a file or a spec. The message names the fix."""

    exit_code = 2


class DataError(ConfigError):
    """A data file that is missing, empty, malformed, or of the wrong shape for the model."""


class CodecSpecError(ConfigError):
    """A codec spec string that does not parse; the message lists the valid forms."""


class WireError(MeshflError):
    """Bytes that are not a valid meshfl wire message (truncated, oversized, garbage)."""


class ChecksumError(WireError):
    """A chunk or an envelope whose CRC-32 does not match its contents."""


class VersionError(WireError):
    """A message in a wire version this build does not speak."""


class PayloadError(WireError):
    """A JSON payload that is not the message it claims to be.

    Raised by every JSON decoder of :mod:`meshfl.wire` (status, control, repair request,
    secure-aggregation bodies, the signed declaration) for input over its byte or nesting
    bound, not UTF-8 JSON, with a duplicate key, or of the wrong shape; never a
    ``RecursionError``, ``KeyError``, ``TypeError`` or ``ValueError``.
    """


class QuotaError(WireError):
    """A well-formed message refused by a bound that keeps a receiver's memory in check.

    A round outside the job's window, a sender over its share of held bytes or partial
    messages, a full receive queue: the message is dropped and counted, never held.
    """


class CodecError(MeshflError):
    """A tensor that cannot be encoded (NaN/inf input) or a payload that cannot be decoded."""


class TopologyError(MeshflError):
    """A graph or mixing matrix that violates an invariant (disconnected, not stochastic)."""


class TransportError(MeshflError):
    """The MQTT broker refused an operation or the connection failed."""


class BrokerUnreachable(TransportError):
    """The MQTT broker did not answer at the given address."""


class CoordinatorError(MeshflError):
    """The coordinator refused a request (the message carries its reason).

    ``status`` is the HTTP status of the refusal (e.g. 401, 403, 404), ``None`` when
    there was no answer or it is unknown.
    """

    def __init__(self, *args: object, status: int | None = None) -> None:
        super().__init__(*args)
        self.status = status


class CoordinatorUnreachable(CoordinatorError):
    """The coordinator did not answer at the given URL."""


class SecurityError(MeshflError):
    """A signature, key or sealed message that does not verify (forged, tampered, wrong key)."""


class Interrupted(MeshflError):
    """The user interrupted a command (Ctrl-C); what it started has been stopped."""

    exit_code = 130
