"""What a device holds for its neighbours' secure-aggregation instances, and when it tells.

In round r, member j of instance (r, i) Shamir-shares its self-mask seed b_{j,r,i} and
its masking key s_sk_{j,r} among the members of N(i) (Bonawitz et al., CCS 2017, §4).
Each member k keeps its shares in a :class:`ShareHolder` and, on aggregator i's signed
declaration, reveals k's share of b_{j,r,i} for each survivor j and of s_sk_{j,r} for
each dropped j — but never both kinds for the same (j, r), whatever the aggregator:
with both, an aggregator could strip every mask off j's input. A request that would
break this is refused for that owner (counted in :attr:`ShareHolder.refusals`, logged)
and the rest of it is answered.

The SHARES and REVEAL messages (:class:`SharesMessage`, :class:`Reveal`) are encoded
and decoded by :mod:`meshfl.wire.shares`; they travel sealed
(:func:`edge_agent.secagg.crypto.seal`). Nothing is pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal

from meshfl.errors import SecurityError
from meshfl.wire import validate_id
from meshfl.wire.shares import Reveal, Share, SharesMessage

__all__ = ["ShareHolder"]

log = logging.getLogger("meshfl.agent.secagg")


class ShareHolder:
    """The shares one device (``device``) holds as a member of other devices' instances.

    Parameters
    ----------
    device
        This device's id, for log messages (``None``: unnamed).

    Attributes
    ----------
    refusals : int
        Owners refused so far because a request asked for the other kind of share.

    """

    def __init__(self, device: str | None = None) -> None:
        self.device = "holder" if device is None else validate_id(device, "device id")
        self.refusals = 0
        self._shares: dict[tuple[str, int, str], tuple[Share, Share]] = {}
        self._revealed: dict[tuple[str, int, str], Literal["b", "s"]] = {}

    def __len__(self) -> int:
        """Number of (owner, round, aggregator) instances held."""
        return len(self._shares)

    def store(
        self, owner: str, round_: int, aggregator: str, b_share: Share, s_share: Share
    ) -> None:
        """Keep ``owner``'s shares for instance (``round_``, ``aggregator``).

        Storing the same shares again (a retransmission) is a no-op.

        Raises
        ------
        SecurityError
            Different shares were already stored for this instance (the first are kept).

        """
        key = (owner, round_, aggregator)
        held = self._shares.get(key)
        if held is not None and held != (b_share, s_share):
            raise SecurityError(
                f"{owner} sent different shares for round {round_}, aggregator {aggregator};"
                " the first ones are kept"
            )
        self._shares[key] = (b_share, s_share)

    def store_message(self, message: SharesMessage) -> None:
        """:meth:`store` every instance of a decoded SHARES message."""
        for aggregator, (b_share, s_share) in message.shares.items():
            self.store(message.owner, message.round, aggregator, b_share, s_share)

    def missing(
        self,
        round_: int,
        aggregator: str,
        survivors: Iterable[str],
        dropped: Iterable[str] = (),
    ) -> list[str]:
        """The owners among ``survivors`` and ``dropped`` (sorted) whose shares are not held.

        Shares for instance (``round_``, ``aggregator``); a request may wait for them.
        """
        owners = set(survivors) | set(dropped)
        return sorted(o for o in owners if (o, round_, aggregator) not in self._shares)

    def reveal(
        self, round_: int, aggregator: str, survivors: Iterable[str], dropped: Iterable[str]
    ) -> Reveal:
        """Answer aggregator ``aggregator``'s request after its (verified) declaration.

        Reveals the b-share of every survivor and the s-share of every dropped owner
        whose shares are held, except where that would reveal both kinds for one
        instance (owner, round, aggregator) — the masking key of an instance is its own
        (:class:`~edge_agent.secagg.crypto.JobKeys` slots), so only the same instance's
        self-mask must stay secret once it is revealed: such an owner — or one listed both
        as survivor and dropped — is refused, counted and logged. An aborted declaration
        must not be answered at all (the caller's job).
        """
        survivors, dropped = set(survivors), set(dropped)
        b_shares: dict[str, Share] = {}
        s_shares: dict[str, Share] = {}
        refused: list[str] = []
        for owner in sorted(survivors | dropped):
            kind: Literal["b", "s"] = "b" if owner in survivors else "s"
            held = self._shares.get((owner, round_, aggregator))
            before = self._revealed.get((owner, round_, aggregator))
            if owner in survivors and owner in dropped:
                reason = "it is declared both a survivor and dropped"
            elif before is not None and before != kind:
                reason = f"its {before}-share of this instance was already revealed"
            elif held is None:
                continue  # nothing to reveal; see missing()
            else:
                self._revealed[(owner, round_, aggregator)] = kind
                (b_shares if kind == "b" else s_shares)[owner] = held[0 if kind == "b" else 1]
                continue
            refused.append(owner)
            self.refusals += 1
            log.warning(
                "%s refuses %s's %s-share of round %d to %s: %s",
                self.device, owner, kind, round_, aggregator, reason,
            )  # fmt: skip
        return Reveal(round_, aggregator, b_shares, s_shares, tuple(refused))

    def forget_before(self, round_: int) -> None:
        """Drop the shares and reveal records of rounds before ``round_`` (bounds memory)."""
        self._shares = {k: v for k, v in self._shares.items() if k[1] >= round_}
        self._revealed = {k: v for k, v in self._revealed.items() if k[1] >= round_}
