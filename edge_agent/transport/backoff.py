"""Reconnect delays: exponential backoff with jitter, so a fleet does not reconnect in lock step.

paho-mqtt's own schedule (``reconnect_delay_set``) doubles a fixed delay after each failed
try and has no jitter: every agent cut off by the same broker restart would knock again
at the same instants. :class:`Backoff` draws each delay from the "equal jitter" scheme of
M. Brooker, *Exponential Backoff And Jitter* (AWS Architecture Blog, 2015)::

    ceiling_n = min(max_s, min_s * 2**n)          n = failed tries since the last success
    delay_n   ~ Uniform(ceiling_n / 2, ceiling_n)

Half of each delay is kept (a client never retries in a tight loop) and half is random
(a fleet spreads out). The MQTT transport hands paho one delay at a time
(:meth:`edge_agent.transport.mqtt.MqttTransport` sets ``reconnect_delay_set(d, d)`` before
each wait), so paho's doubling never applies.
"""

from __future__ import annotations

import random

from meshfl.errors import ConfigError

__all__ = ["Backoff"]

_MAX_EXPONENT = 62  # 2**62 * min_s is past any max_s; keeps the arithmetic finite


class Backoff:
    """A jittered exponential backoff schedule (see the module docstring).

    Parameters
    ----------
    min_s : float
        Ceiling of the first delay, seconds (> 0); the first delay is in
        ``[min_s / 2, min_s]``.
    max_s : float
        Largest ceiling, seconds (>= ``min_s``); delays never exceed it.
    rng : random.Random or None
        Source of the jitter; None (default) seeds one from the OS. Pass a seeded one in
        tests.

    Raises
    ------
    ConfigError
        ``min_s`` is not positive or ``max_s`` is below it.

    """

    def __init__(self, min_s: float, max_s: float, rng: random.Random | None = None) -> None:
        if not min_s > 0 or not max_s >= min_s:
            raise ConfigError(
                f"reconnect delays need 0 < min <= max seconds, got min={min_s!r} max={max_s!r}"
            )
        self.min_s, self.max_s = float(min_s), float(max_s)
        self._rng = rng if rng is not None else random.Random()
        self._failures = 0

    @property
    def failures(self) -> int:
        """Delays drawn since the last :meth:`reset` (failed tries in a row)."""
        return self._failures

    def next_delay(self) -> float:
        """Return the delay before the next try, in seconds, and count one more failure."""
        ceiling = min(self.max_s, self.min_s * 2.0 ** min(self._failures, _MAX_EXPONENT))
        self._failures += 1
        return self._rng.uniform(ceiling / 2.0, ceiling)

    def reset(self) -> None:
        """Start again from ``min_s``: call it when a connection succeeds."""
        self._failures = 0
