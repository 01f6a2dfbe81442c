"""One device's keys in a secure job: the verified directory and what is derived from it.

Per-edge AES-GCM keys (X25519 agreement), pairwise mask seeds m_jk of each instance
(round r, aggregator i), the shared-seed random-k coordinates of an instance, and the
coordinator's signature on a forwarded declaration — everything the
:class:`~edge_agent.secure_engine.SecureEngine` asks of keys, in one place (Bonawitz et
al., CCS 2017, §4; ``docs/privacy.md``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edge_agent.secagg.crypto import (
    JobKeys,
    ParsedBundle,
    mask_seed,
    open_sealed,
    seal,
    seal_aad,
    share_key,
    verify_signature,
)
from meshfl.aggregation import shared_indices
from meshfl.contract import Declaration
from meshfl.errors import SecurityError
from meshfl.wire.secagg import SignedRequest, encode_declaration

__all__ = ["Directory", "Keyring"]


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


class Keyring:
    """The keys of one device in one job, and the directory of everyone else's.

    Parameters
    ----------
    directory
        The verified key directory.
    keys
        This device's per-job keys (one masking key per round and aggregator slot).
    job_id, device_id
        This device's job.
    density
        Shared-seed random-k density in (0, 1] (1.0: dense, no index set).
    flat_size, index_count
        Elements of the flattened model, and of a random-k index set.

    """

    def __init__(
        self,
        directory: Directory,
        keys: JobKeys,
        job_id: str,
        device_id: str,
        density: float,
        flat_size: int,
        index_count: int,
    ) -> None:
        self.directory, self.keys = directory, keys
        self.job_id, self.device_id = job_id, device_id
        self.density, self.flat_size, self.index_count = density, flat_size, index_count
        self._share_keys: dict[str, bytes] = {}

    def _key_for(self, peer: str) -> bytes:
        key = self._share_keys.get(peer)
        if key is None:
            key = share_key(self.keys.c_private, self.directory.bundles[peer].c_pk)
            self._share_keys[peer] = key
        return key

    def seal(self, dst: str, round_: int, plaintext: bytes) -> bytes:
        """``plaintext`` sealed for ``dst`` in ``round_`` (AES-GCM, the edge's key)."""
        aad = seal_aad(self.job_id, round_, self.device_id, dst)
        return seal(self._key_for(dst), plaintext, aad)

    def open(self, src: str, round_: int, ciphertext: bytes) -> bytes:
        """The plaintext ``src`` sealed for this device in ``round_``.

        Raises
        ------
        SecurityError
            The ciphertext does not open under the edge's key (from ``open_sealed``).

        """
        aad = seal_aad(self.job_id, round_, src, self.device_id)
        return open_sealed(self._key_for(src), ciphertext, aad)

    def index_seed(self, round_: int, aggregator: str) -> bytes:
        """The 32-byte seed of instance (round, aggregator)'s random-k coordinates."""
        text = f"meshfl randk|{self.job_id}|{round_}|{aggregator}"
        return hashlib.sha256(text.encode()).digest()

    def indices(self, round_: int, aggregator: str) -> np.ndarray | None:
        """The shared-seed random-k coordinates of instance (round, aggregator); None: dense."""
        if self.density >= 1.0:
            return None
        return shared_indices(self.index_seed(round_, aggregator), self.flat_size, self.index_count)

    def input_size(self, round_: int, aggregator: str) -> int:
        """Words in a masked input of instance (round, aggregator)."""
        indices = self.indices(round_, aggregator)
        return self.flat_size if indices is None else len(indices)

    def s_public(self, member: str, round_: int, aggregator: str) -> bytes:
        """``member``'s masking public key for instance (round, aggregator)."""
        slot = self.directory.neighbourhoods[member].index(aggregator)
        return self.directory.bundles[member].s_pk(round_, slot)

    def mask_seed(
        self, s_private: bytes, owner: str, other: str, round_: int, aggregator: str
    ) -> bytes:
        """m_{owner,other} of instance (round, aggregator), from ``owner``'s private key."""
        return mask_seed(
            s_private,
            self.s_public(other, round_, aggregator),
            self.job_id,
            round_,
            aggregator,
            owner,
            other,
        )

    def check_declaration(
        self, src: str, request: SignedRequest, neighbours: tuple[str, ...]
    ) -> Declaration:
        """The declaration of a REQUEST from aggregator ``src``, verified.

        Raises
        ------
        SecurityError
            The coordinator's signature does not verify, or the declaration is not
            ``src``'s own in this job, or ``src`` is not one of ``neighbours``.

        """
        declaration = request.declaration
        verify_signature(
            self.directory.coordinator_key, encode_declaration(declaration), request.signature
        )
        if (
            declaration["aggregator"] != src
            or declaration["job"] != self.job_id
            or src not in neighbours
        ):
            raise SecurityError(f"{src} forwarded a declaration that is not its own")
        return declaration
