"""Secure aggregation: key bundles, the key directory, signed declarations (``.../secagg``)."""

from __future__ import annotations

from typing_extensions import TypedDict

from meshfl.contract._schema import strict, strict_request

__all__ = ["Declaration", "KeyBundle", "SecAggDirectory", "SignedDeclaration"]


@strict_request
class KeyBundle(TypedDict):
    r"""A device's public keys for one secure-aggregation job (``PUT .../secagg/keys/{device}``).

    ``c_pk`` is the X25519 public key that seals Shamir shares (raw 32 bytes, standard
    base64); ``s_pks`` the per-round X25519 masking public keys of rounds ``1..rounds``,
    concatenated raw 32-byte keys (``rounds × 32`` bytes, base64); ``signature`` the
    device's Ed25519 identity signature over ``b"meshfl-keybundle-v1\0" + job + b"\0" +
    device + b"\0" + c_pk raw + s_pks raw`` (base64). See ``docs/privacy.md``.
    """

    device: str
    job: str
    c_pk: str
    s_pks: str
    signature: str


@strict
class SecAggDirectory(TypedDict):
    """The job's authenticated public-key directory (``GET .../secagg/directory``).

    ``coordinator_key`` is the coordinator's Ed25519 public key (raw 32 bytes, base64),
    which signs declarations; ``identity_keys`` maps each current participant that has
    one to its Ed25519 identity key; ``neighbourhoods`` maps each current participant to
    its sorted neighbour ids N(i); ``complete``: every current participant uploaded its
    bundle.
    """

    job_id: str
    threshold: int
    coordinator_key: str
    identity_keys: dict[str, str]
    bundles: dict[str, KeyBundle]
    neighbourhoods: dict[str, list[str]]
    complete: bool


@strict_request
class Declaration(TypedDict):
    """An aggregator's survivors and dropouts of one round (Bonawitz et al. 2017, round 3).

    ``survivors`` ∪ ``dropped`` is the aggregator's neighbourhood N(i), disjoint, both
    sorted; ``aborted`` is ``len(survivors) < threshold`` (nothing is reconstructed).
    """

    job: str
    round: int
    aggregator: str
    survivors: list[str]
    dropped: list[str]
    aborted: bool


@strict
class SignedDeclaration(TypedDict):
    """A declaration signed by the coordinator (first write wins).

    ``signature`` is Ed25519 (base64) over ``json.dumps(declaration, sort_keys=True,
    separators=(",", ":")).encode()``, checked with ``SecAggDirectory.coordinator_key``.
    """

    declaration: Declaration
    signature: str
