"""The aggregator's side of one secure-aggregation instance (round r, aggregator i).

Bonawitz et al., CCS 2017, Figure 4, from the server's seat: collect the members'
masked inputs (words mod 2^b), propose the survivor set (the declaration the coordinator
signs), collect ≥ t revealed shares per secret and remove the masks from the sum of the
survivors' inputs. An :class:`Instance` lives for one round and a few more (late
messages); the :class:`~edge_agent.secure_engine.SecureEngine` keeps one per round and
does the messaging.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edge_agent.secagg.shamir import combine_shares
from meshfl.aggregation import add_mod, unmask, unpack_words
from meshfl.contract import Declaration
from meshfl.errors import WireError
from meshfl.wire.secagg import decode_mask_set
from meshfl.wire.shares import Reveal

__all__ = ["Instance"]

log = logging.getLogger("meshfl.agent.secure")

PairSeed = Callable[[bytes, str, str], bytes]
"""``(s_private of dropped member k, k, survivor j) -> m_jk``: the pairwise mask seed."""


@dataclass
class Instance:
    """The aggregator's state of its own instance of one round.

    ``members`` are N(i), sorted; ``inputs`` maps each member whose masked input arrived
    to its words (uint64, one per coordinate), ``masked_with`` to the co-members it
    masked with (S_j); ``b_shares``/``s_shares`` map an owner to its revealed shares
    (share index → share bytes) of its self-mask seed / masking key.
    """

    members: tuple[str, ...]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    masked_with: dict[str, frozenset[str]] = field(default_factory=dict)  # sender -> S_j
    declaration: Declaration | None = None
    b_shares: dict[str, dict[int, bytes]] = field(default_factory=dict)
    s_shares: dict[str, dict[int, bytes]] = field(default_factory=dict)
    done: bool = False

    def complete(self, offline: set[str]) -> bool:
        """Whether every member not ``offline`` sent its masked input."""
        return set(self.members) - offline <= set(self.inputs)

    def missing(self, neighbours: tuple[str, ...]) -> list[str]:
        """The sorted ``neighbours`` not in the unmasked sum (all: aborted or not done)."""
        declaration = self.declaration
        if declaration is None or declaration["aborted"] or not self.done:
            return sorted(neighbours)
        return sorted(set(neighbours) - set(declaration["survivors"]))

    def add_input(self, src: str, words: bytes, mask_set: bytes, n: int, bits: int) -> bool:
        """Take ``src``'s masked input: ``n`` packed ``bits``-bit words and its mask set.

        Returns False only for the input of a member the declaration already dropped
        (the caller counts it); any other input after the declaration is ignored.

        Raises
        ------
        WireError
            ``src`` is not a member, sent a second input, or masked with a non-member.

        """
        if src not in self.members:
            raise WireError(f"{src} is not in this device's neighbourhood")
        if self.declaration is not None:
            return src not in self.declaration["dropped"]
        if src in self.inputs:
            raise WireError(f"{src} sent a second masked input")
        masked_with = decode_mask_set(mask_set)
        if not set(masked_with) <= set(self.members):
            raise WireError(f"{src}'s mask set is not a subset of this neighbourhood")
        self.inputs[src] = unpack_words(words, n, bits)
        self.masked_with[src] = frozenset(masked_with) - {src}
        return True

    def propose(self, job: str, round_: int, aggregator: str, threshold: int) -> Declaration:
        """The declaration to have signed: survivors, dropped members, whether aborted.

        Dropped: members some survivor masked with but that sent no input (their masks
        must go). Aborted: fewer than ``threshold`` survivors, or two survivors that
        masked with each other one-sidedly (their masks would not cancel).
        """
        survivors = sorted(self.inputs)
        alive = set(survivors)
        dropped = sorted(set().union(*self.masked_with.values()) - alive)
        lopsided = sorted(
            f"{j}/{k}"
            for j in survivors
            for k in self.masked_with[j] & alive
            if j not in self.masked_with[k]
        )
        if lopsided:
            log.warning(
                "round %d: survivors %s masked with each other one-sidedly (a member crashed"
                " while sending shares): round aborted",
                round_,
                lopsided,
            )
        return {
            "job": job,
            "round": round_,
            "aggregator": aggregator,
            "survivors": survivors,
            "dropped": dropped,
            "aborted": len(survivors) < threshold or bool(lopsided),
        }

    def add_reveal(self, src: str, reveal: Reveal) -> None:
        """Keep the shares ``src`` revealed that the declaration asks for; ignore others.

        Raises
        ------
        WireError
            ``src`` is not a member of this neighbourhood.

        """
        if self.declaration is None or self.done:
            return
        if src not in self.members:
            raise WireError(f"{src} is not a member of this neighbourhood")
        for owner, share in reveal.b_shares.items():
            if owner in self.declaration["survivors"]:
                self.b_shares.setdefault(owner, {})[share[0]] = share[1]
        for owner, share in reveal.s_shares.items():
            if owner in self.declaration["dropped"]:
                self.s_shares.setdefault(owner, {})[share[0]] = share[1]

    def unmask(self, threshold: int, pair_seed: PairSeed, bits: int) -> np.ndarray | None:
        """The survivors' sum without masks (words mod 2^``bits``); None: shares missing.

        Needs ``threshold`` shares of every survivor's self-mask seed and of every
        dropped member's masking key; each survivor j that masked with a dropped k added
        sign(j, k)·PRG(m_jk), which is taken off again.
        """
        declaration = self.declaration
        if declaration is None:
            return None
        survivors, dropped, t = declaration["survivors"], declaration["dropped"], threshold
        if any(len(self.b_shares.get(j, {})) < t for j in survivors) or any(
            len(self.s_shares.get(j, {})) < t for j in dropped
        ):
            return None
        self_seeds = [combine_shares(sorted(self.b_shares[j].items())[:t]) for j in survivors]
        pairwise: list[tuple[bytes, int]] = []
        for k in dropped:
            s_private = combine_shares(sorted(self.s_shares[k].items())[:t])
            for j in survivors:
                if k in self.masked_with[j]:
                    pairwise.append((pair_seed(s_private, k, j), 1 if j < k else -1))
        total = add_mod([self.inputs[j] for j in survivors], bits)
        return unmask(total, self_seeds, pairwise, bits)
