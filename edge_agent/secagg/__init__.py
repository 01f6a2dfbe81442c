"""The agent's side of secure aggregation (Bonawitz et al., CCS 2017): keys and shares.

:mod:`edge_agent.secagg.crypto` holds the key material (identity, per-job keys, key
bundles) and the primitives (sealing, mask seeds, Shamir shares);
:mod:`edge_agent.secagg.holder` what a device holds for its neighbours and its refusal
policy. The masking arithmetic is in :mod:`meshfl.aggregation` (numpy only).
"""

from edge_agent.secagg.crypto import (
    IdentityKey,
    JobKeys,
    ParsedBundle,
    combine_shares,
    identity_key_path,
    mask_seed,
    open_sealed,
    seal,
    seal_aad,
    share_key,
    split_secret,
    verify_bundle,
    verify_signature,
)
from edge_agent.secagg.holder import (
    Reveal,
    ShareHolder,
    SharesMessage,
    decode_reveal,
    decode_shares,
    encode_reveal,
    encode_shares,
)

__all__ = [
    "IdentityKey",
    "JobKeys",
    "ParsedBundle",
    "Reveal",
    "ShareHolder",
    "SharesMessage",
    "combine_shares",
    "decode_reveal",
    "decode_shares",
    "encode_reveal",
    "encode_shares",
    "identity_key_path",
    "mask_seed",
    "open_sealed",
    "seal",
    "seal_aad",
    "share_key",
    "split_secret",
    "verify_bundle",
    "verify_signature",
]
