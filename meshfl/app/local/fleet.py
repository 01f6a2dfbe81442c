"""Per-device options of a local fleet: slow devices, shaped links, devices that join or die.

``meshfl local`` options that make a one-machine fleet heterogeneous and changing, for
tests and benchmarks (issue 4, item 6; docs/heterogeneity.md):

- ``--slow DEVICE:FACTOR``: that agent trains FACTOR times slower (``--slowdown``);
- ``--link DEVICE:RATE[:LATENCY]``: that agent reaches the broker through a
  :class:`meshfl.app.local.lab.shaping.ShapingProxy`;
- ``--join-at ROUND``: one more agent starts once ROUND's summary appears (joiners are
  named ``device-N``, ``device-N+1``, … after the N first agents, in round order);
- ``--kill DEVICE@ROUND``: SIGKILL that agent once ROUND's summary appears.

DEVICE is an index (``3``) or a name (``device-3``).
"""

from __future__ import annotations

import math
import re
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshfl.app.local.lab.shaping import ShapingProxy, parse_link
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.app.local.config import LocalConfig
    from meshfl.app.local.processes import Supervisor

__all__ = [
    "Churn",
    "device_name",
    "joiner_names",
    "parse_kill",
    "parse_link_option",
    "parse_slow",
    "start_links",
    "validate_fleet",
]

_DEVICE = re.compile(r"(?:device-)?(\d{1,4})")


def device_name(text: str, option: str) -> str:
    """``"3"`` or ``"device-3"`` → ``"device-3"``; ConfigError naming ``option`` otherwise."""
    match = _DEVICE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(
            f"{option}: {text!r} is not a device; use an index (3) or a name (device-3)"
        )
    return f"device-{int(match[1])}"


def parse_slow(text: str) -> tuple[str, float]:
    """``--slow DEVICE:FACTOR`` → ``("device-3", 4.0)``; the factor is checked by validation."""
    device, sep, factor = text.partition(":")
    try:
        value = float(factor) if sep else math.nan
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise ConfigError(f"--slow {text!r}: use DEVICE:FACTOR, e.g. --slow 3:4")
    return device_name(device, "--slow"), value


def parse_link_option(text: str) -> tuple[str, str]:
    """``--link DEVICE:RATE[:LATENCY]`` → ``("device-3", "1mbit:200ms")`` (spec checked)."""
    device, sep, spec = text.partition(":")
    if not sep:
        raise ConfigError(f"--link {text!r}: use DEVICE:RATE[:LATENCY], e.g. --link 3:1mbit:200ms")
    try:
        parse_link(spec)
    except ConfigError as exc:
        raise ConfigError(f"--link {text!r}: {exc}") from None
    return device_name(device, "--link"), spec.strip()


def parse_kill(text: str) -> tuple[str, int]:
    """``--kill DEVICE@ROUND`` → ``("device-2", 8)``."""
    device, sep, round_ = text.partition("@")
    if not sep or not round_.strip().isdigit():
        raise ConfigError(f"--kill {text!r}: use DEVICE@ROUND, e.g. --kill device-2@8")
    return device_name(device, "--kill"), int(round_)


def joiner_names(config: LocalConfig) -> list[str]:
    """Names of the agents ``--join-at`` starts, in the order they join."""
    return [f"device-{config.agents + k}" for k in range(len(config.join_at))]


def _join_rounds(config: LocalConfig) -> dict[str, int]:
    return dict(zip(joiner_names(config), sorted(config.join_at), strict=True))


def validate_fleet(config: LocalConfig) -> None:
    """Check ``slow``, ``links``, ``join_at`` and ``kill`` against the fleet and the rounds.

    Raises
    ------
    meshfl.errors.ConfigError
        A device outside the fleet (initial agents and joiners), a device named twice in
        one option, a factor below 1, a negative step time, a bad link spec, a join or
        kill round outside ``1 .. rounds − 1``, a joiner killed before it joins, or every
        agent killed.

    """
    joins = _join_rounds(config)
    known = {f"device-{i}" for i in range(config.agents)} | set(joins)
    total = config.agents + len(joins)
    for option, pairs in (("--slow", config.slow), ("--link", config.links),
                          ("--kill", config.kill)):  # fmt: skip
        names = [device_name(name, option) for name, _ in pairs]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(
                f"{option}: {unknown[0]} is not in this fleet (devices 0..{total - 1})"
            )
        if len(set(names)) < len(names):
            raise ConfigError(f"{option}: a device is named twice; give each device once")
    for name, factor in config.slow:
        if not (math.isfinite(factor) and factor >= 1):
            raise ConfigError(f"--slow {name}:{factor}: the factor must be a finite number >= 1")
    if not (math.isfinite(config.step_time_s) and config.step_time_s >= 0):
        raise ConfigError(f"--step-time {config.step_time_s}: use a number of seconds >= 0")
    for _, spec in config.links:
        parse_link(spec)
    for round_ in config.join_at:
        if not 1 <= round_ < config.rounds:
            raise ConfigError(f"--join-at {round_}: use a round in 1..{config.rounds - 1}")
    for name, round_ in config.kill:
        if not 1 <= round_ < config.rounds:
            raise ConfigError(f"--kill {name}@{round_}: use a round in 1..{config.rounds - 1}")
        joined = joins.get(device_name(name, "--kill"))
        if joined is not None and round_ <= joined:
            raise ConfigError(
                f"--kill {name}@{round_}: it joins after round {joined}; kill it later"
            )
    if len(config.kill) >= total - 1:
        raise ConfigError("--kill would leave fewer than two agents; kill fewer devices")


def start_links(config: LocalConfig, broker_url: str) -> dict[str, ShapingProxy]:
    """Start one shaping proxy to the broker per ``--link``; ``{device name: proxy}``.

    The caller passes ``mqtt://127.0.0.1:{port}`` to that agent and stops the proxies.
    """
    from edge_agent.transport.address import parse_broker_address

    broker = parse_broker_address(broker_url)
    host, port = broker.host, broker.port
    proxies: dict[str, ShapingProxy] = {}
    try:
        for name, spec in config.links:
            proxy = ShapingProxy(host, port, parse_link(spec))
            proxy.start()
            proxies[device_name(name, "--link")] = proxy
    except BaseException:
        for proxy in proxies.values():
            proxy.stop()
        raise
    return proxies


class Churn:
    """Starts joiners and SIGKILLs agents when a round's summary appears.

    Parameters
    ----------
    config : LocalConfig
        ``join_at`` and ``kill``.
    start_agent : callable
        Starts the agent process of a joiner, given its name.

    Attributes
    ----------
    events : list of dict
        ``{"event": "join" | "kill", "device": name, "round": ROUND, "at_s": seconds
        since :meth:`start`}``, in order.
    killed : set of str
        Names of the agents killed on purpose (their exit is not a failure).

    """

    def __init__(self, config: LocalConfig, start_agent: Callable[[str], object]) -> None:
        self._joins: dict[int, list[str]] = {}
        for name, round_ in _join_rounds(config).items():
            self._joins.setdefault(round_, []).append(name)
        self._kills: dict[int, list[str]] = {}
        for name, round_ in config.kill:
            self._kills.setdefault(round_, []).append(device_name(name, "--kill"))
        self._start_agent = start_agent
        self._t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.killed: set[str] = set()

    def start(self) -> None:
        """Start the clock of ``at_s`` (call when the job starts)."""
        self._t0 = time.monotonic()

    def on_round(self, round_: int, supervisor: Supervisor) -> list[str]:
        """Act on round ``round_``'s summary; return one line per event, for the operator."""
        lines = []
        for name in self._joins.pop(round_, []):
            self._start_agent(name)
            lines.append(self._record("join", name, round_, "started (joins the job)"))
        for name in self._kills.pop(round_, []):
            child = next((c for c in supervisor.children if c.name == name), None)
            if child is None or child.returncode is not None:
                continue
            self.killed.add(name)
            child.stop(signal.SIGKILL)
            lines.append(self._record("kill", name, round_, "killed (SIGKILL)"))
        return lines

    def _record(self, event: str, name: str, round_: int, what: str) -> str:
        at = time.monotonic() - self._t0
        self.events.append({"event": event, "device": name, "round": round_, "at_s": at})
        return f"after round {round_}: {name} {what}"
