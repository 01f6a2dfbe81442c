"""``meshfl local --chaos SPEC``: every agent reaches the broker through a fault proxy.

SPEC is a comma-separated list (the option may be repeated; its parts are joined)::

    drop=P       drop a data PUBLISH with probability P (a loss the engine must detect)
    dup=P        deliver it twice
    reorder=P    hold it and deliver it after the next one
    corrupt=P    flip one byte of its payload (the chunk's CRC-32 must refuse it)
    delay=MS     deliver every data PUBLISH MS milliseconds late (at most 2000)
    seed=N       seed of the faults (default: the run's --seed)
    partition=DEVICE@ROUND:SECONDS
                 cut that device off the broker, both ways, for SECONDS once ROUND's
                 summary appears (repeatable); longer than 1.5x the MQTT keepalive
                 (30 s), Mosquitto drops it and publishes its Last Will
    broker=ROUND:term|kill[:SECONDS]
                 SIGTERM / SIGKILL the broker during ROUND, restart it SECONDS later
                 (default 2) on the same port and persistence (the run's own Mosquitto)
    coordinator=ROUND[:SECONDS]
                 SIGKILL the coordinator during ROUND, restart it SECONDS later (default 2)
    restart=DEVICE@ROUND[:SECONDS]
                 SIGKILL that agent during ROUND, restart it SECONDS later (default 1)

e.g. ``drop=0.1,dup=0.1,reorder=0.05,corrupt=0.01,seed=1`` or
``partition=device-2@5:50``. Faults hit the broker → agent direction of the data plane
(delta and inbox topics): each delivery of a chunk to a receiver is decided once, from a
generator seeded with ``SEED:DEVICE`` (:mod:`meshfl.app.local.lab.chaos_proxy` says exactly
what each fault does; :mod:`meshfl.app.local.lab.process_faults` the process faults, which
need no proxy). With ``--link``, a device's chaos proxy sits in front of its
shaping proxy. Not with ``--secure`` or an ``mqtts://`` broker: the proxy reads MQTT
packets, and TLS hides them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from meshfl.app.local.fleet import device_name, joiner_names
from meshfl.app.local.lab.chaos_proxy import ChaosProxy, FaultCounts, Faults
from meshfl.app.local.lab.process_faults import (
    PROCESS_KEYS,
    ProcessFault,
    ProcessFaults,
    parse_process_fault,
    process_fault_line,
)
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.app.local.config import LocalConfig
    from meshfl.app.local.lab.shaping import ShapingProxy
    from meshfl.app.local.monitor import RoundHook

__all__ = ["ChaosFleet", "ChaosSpec", "Partition", "chaos_line", "parse_chaos", "validate_chaos"]

MAX_PARTITION_S = 3600.0
"""The longest partition, seconds."""

_PROBABILITIES = {"drop": "drop", "dup": "duplicate", "reorder": "reorder", "corrupt": "corrupt"}
_USAGE = (
    "use KEY=VALUE pairs separated by commas: drop, dup, reorder, corrupt (probabilities),"
    " delay (ms), seed, partition=DEVICE@ROUND:SECONDS, broker=ROUND:term|kill[:SECONDS],"
    " coordinator=ROUND[:SECONDS], restart=DEVICE@ROUND[:SECONDS]; e.g. drop=0.1,dup=0.1,seed=1"
)


@dataclass(frozen=True)
class Partition:
    """Cut ``device`` off the broker for ``seconds`` once round ``after_round`` settles."""

    device: str
    after_round: int
    seconds: float


@dataclass(frozen=True)
class ChaosSpec:
    """A parsed ``--chaos`` SPEC: faults, seed (None: the run's), partitions, process faults.

    ``processes`` are :class:`~meshfl.app.local.lab.process_faults.ProcessFault`, in SPEC order.
    """

    faults: Faults
    seed: int | None = None
    partitions: tuple[Partition, ...] = ()
    processes: tuple[ProcessFault, ...] = ()
    network: bool = True
    """Whether the fault proxies run: a packet fault (``drop=0`` too) or a partition given."""


def parse_chaos(text: str) -> ChaosSpec:
    """Parse a ``--chaos`` SPEC (see the module docstring).

    Raises
    ------
    ConfigError
        An unknown key, a key given twice (``partition`` and the process faults aside),
        or a bad value; the message quotes the option and shows the expected form.

    """
    values: dict[str, float] = {}
    seed: int | None = None
    partitions: list[Partition] = []
    processes: list[ProcessFault] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        key = key.lower()
        if not sep or not value:
            raise ConfigError(f"--chaos {item!r}: {_USAGE}")
        if key == "partition":
            partitions.append(_partition(value))
            continue
        if key in PROCESS_KEYS:
            processes.append(parse_process_fault(key, value))
            continue
        if key in values or (key == "seed" and seed is not None):
            raise ConfigError(f"--chaos: {key} is given twice; give it once")
        if key == "seed":
            if not (value.isascii() and value.isdigit()) or int(value) >= 2**32:
                raise ConfigError(f"--chaos seed={value}: use an integer in [0, 2^32)")
            seed = int(value)
        elif key in _PROBABILITIES or key == "delay":
            values[key] = _number(key, value)
        else:
            raise ConfigError(f"--chaos: unknown key {key!r}; {_USAGE}")
    if not values and not partitions and not processes:
        raise ConfigError(f"--chaos {text!r} injects nothing; {_USAGE}")
    try:
        faults = Faults(
            **{name: values.get(key, 0.0) for key, name in _PROBABILITIES.items()},
            delay_s=values.get("delay", 0.0) / 1000,
        )
    except ConfigError as exc:
        raise ConfigError(f"--chaos {str(exc).removeprefix('chaos ')}") from None
    network = bool(values) or bool(partitions)
    return ChaosSpec(faults, seed, tuple(partitions), tuple(processes), network)


def _number(key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        what = "milliseconds" if key == "delay" else "a probability in [0, 1]"
        raise ConfigError(f"--chaos {key}={value}: use {what}")
    return number


def _partition(value: str) -> Partition:
    device, at, rest = value.partition("@")
    round_, colon, seconds = rest.partition(":")
    usage = f"--chaos partition={value}: use DEVICE@ROUND:SECONDS, e.g. partition=device-2@5:40"
    try:
        span = float(seconds) if colon else math.nan
    except ValueError:
        span = math.nan
    if not at or not (round_.strip().isascii() and round_.strip().isdigit()) or math.isnan(span):
        raise ConfigError(usage)
    if not (math.isfinite(span) and 0 < span <= MAX_PARTITION_S):
        raise ConfigError(f"--chaos partition={value}: SECONDS must be in (0, {MAX_PARTITION_S:g}]")
    return Partition(device_name(device, "--chaos partition"), int(round_), span)


def validate_chaos(config: LocalConfig) -> None:
    """Check ``config.chaos`` against the fleet, the rounds and the broker.

    Raises
    ------
    ConfigError
        A bad SPEC, ``--secure`` or an ``mqtts://`` broker, a partitioned device outside
        the fleet, or a partition round outside ``1 .. rounds − 1``; and for the process
        faults (:func:`_validate_processes`) a round outside ``1 .. rounds − 1``, a device
        outside the fleet, killed by ``--kill`` or not yet joined, the same process
        twice in a round, or a broker fault with ``--broker`` or without Mosquitto.

    """
    if not config.chaos:
        return
    spec = parse_chaos(config.chaos)
    if config.secure or (config.broker or "").strip().lower().startswith("mqtts://"):
        raise ConfigError(
            "--chaos reads MQTT packets and TLS hides them: drop --secure (or use an mqtt://"
            " broker), or drop --chaos"
        )
    known = {f"device-{i}" for i in range(config.agents)} | set(joiner_names(config))
    _validate_processes(config, spec.processes, known)
    for p in spec.partitions:
        where = f"--chaos partition={p.device}@{p.after_round}"
        if p.device not in known:
            raise ConfigError(f"{where}: {p.device} is not in this fleet (0..{len(known) - 1})")
        if not 1 <= p.after_round < config.rounds:
            raise ConfigError(f"{where}: use a round in 1..{config.rounds - 1}")


def _validate_processes(
    config: LocalConfig, faults: tuple[ProcessFault, ...], known: set[str]
) -> None:
    seen: set[tuple[str, int]] = set()
    joins = dict(zip(joiner_names(config), sorted(config.join_at), strict=True))
    killed = {device_name(name, "--kill") for name, _ in config.kill}
    for f in faults:
        where = f"--chaos {f.key}={'' if f.key != 'restart' else f.target + '@'}{f.round}"
        if not 1 <= f.round < config.rounds:
            raise ConfigError(f"{where}: use a round in 1..{config.rounds - 1}")
        if (f.target, f.round) in seen:
            raise ConfigError(f"{where}: {f.target} is stopped twice in round {f.round}; once")
        seen.add((f.target, f.round))
        if f.key == "restart":
            if f.target not in known:
                raise ConfigError(f"{where}: {f.target} is not in this fleet (0..{len(known) - 1})")
            if f.target in killed:
                raise ConfigError(f"{where}: --kill also names {f.target}; use one of them")
            joined = joins.get(f.target)
            if joined is not None and f.round <= joined:
                raise ConfigError(f"{where}: it joins after round {joined}; restart it later")
    if any(f.key == "broker" for f in faults):
        _check_broker_faults(config)


def _check_broker_faults(config: LocalConfig) -> None:
    """A broker fault needs the run's own Mosquitto: no ``--broker``, Mosquitto installed."""
    from broker.mosquitto import find_mosquitto

    if config.broker is not None:
        raise ConfigError(
            "--chaos broker=...: meshfl local restarts only a broker it starts itself; drop"
            " --broker (it then runs its own Mosquitto)"
        )
    try:
        find_mosquitto()
    except ConfigError:
        raise ConfigError(
            "--chaos broker=... restarts the run's own Mosquitto (the embedded amqtt broker"
            " keeps no state across a restart), which is not installed: install it with"
            " `apt-get install mosquitto` or `brew install mosquitto`"
        ) from None


class ChaosFleet:
    """One :class:`ChaosProxy` per agent of a local run, and the partitions' schedule.

    Use :meth:`start`; pass ``mqtt://127.0.0.1:{port(name)}`` to each agent in
    :attr:`proxies` (none when the SPEC holds only process faults), call :meth:`on_round`
    for each settled round (or wrap the run's hook with :meth:`wrap`), put :meth:`report`
    in ``report.json`` and :meth:`stop` the proxies at the end. The caller sets
    :attr:`processes` when the SPEC has process faults (it needs the run's processes).
    """

    def __init__(
        self, text: str, spec: ChaosSpec, seed: int, proxies: dict[str, ChaosProxy]
    ) -> None:
        self.text, self.spec, self.seed, self.proxies = text, spec, seed, proxies
        self.events: list[dict[str, Any]] = []
        self.processes: ProcessFaults | None = None
        self._due: dict[int, list[Partition]] = {}
        for p in spec.partitions:
            self._due.setdefault(p.after_round, []).append(p)
        self._t0 = time.monotonic()

    @classmethod
    def start(
        cls, config: LocalConfig, broker_url: str, links: Mapping[str, ShapingProxy]
    ) -> ChaosFleet:
        """Start a proxy per device (joiners too) to the broker or to the device's link.

        No proxy when the SPEC gives no packet fault and no partition (``spec.network``).
        """
        from edge_agent.transport.address import parse_broker_address

        address = parse_broker_address(broker_url)
        broker = (address.host, address.port)
        spec = parse_chaos(config.chaos)
        seed = config.seed if spec.seed is None else spec.seed
        names = [f"device-{i}" for i in range(config.agents)] + joiner_names(config)
        if not spec.network:
            names = []
        proxies: dict[str, ChaosProxy] = {}
        try:
            for name in names:
                link = links.get(name)
                host, port = broker if link is None else ("127.0.0.1", link.port or 0)
                proxies[name] = ChaosProxy(host, port, spec.faults, f"{seed}:{name}")
                proxies[name].start()
        except BaseException:
            for proxy in proxies.values():
                proxy.stop()
            raise
        return cls(config.chaos, spec, seed, proxies)

    def port(self, name: str) -> int:
        """The port on 127.0.0.1 that agent ``name`` connects to."""
        port = self.proxies[name].port
        if port is None:
            raise RuntimeError(f"the chaos proxy of {name} is not started")
        return port

    def on_round(self, round_: int) -> list[str]:
        """Start the partitions due after round ``round_``; one line per partition."""
        lines = []
        for p in self._due.pop(round_, []):
            self.proxies[p.device].partition(p.seconds)
            at = time.monotonic() - self._t0
            self.events.append(
                {"device": p.device, "round": round_, "seconds": p.seconds, "at_s": at}
            )
            lines.append(f"after round {round_}: {p.device} cut off the broker for {p.seconds:g} s")
        return lines

    def wrap(self, hook: RoundHook | None, say: Callable[[str], None]) -> RoundHook:
        """The run's round hook with the partitions first (their lines go to ``say``)."""

        def on_round(summary: Any, supervisor: Any) -> None:
            for line in self.on_round(summary["round"]):
                say(line)
            if hook is not None:
                hook(summary, supervisor)

        return on_round

    def report(self) -> dict[str, Any]:
        """The ``chaos`` section of ``report.json`` (see docs/reliability.md)."""
        devices = {name: proxy.counts.as_dict() for name, proxy in self.proxies.items()}
        totals = {f.name: sum(d[f.name] for d in devices.values()) for f in fields(FaultCounts)}
        faults = self.spec.faults
        return {
            "spec": self.text,
            "seed": self.seed,
            "faults": {
                "drop": faults.drop,
                "duplicate": faults.duplicate,
                "reorder": faults.reorder,
                "corrupt": faults.corrupt,
                "delay_ms": faults.delay_s * 1000,
            },
            "direction": "broker->agent, delta and inbox topics",
            "totals": totals,
            "devices": devices,
            "partitions": list(self.events),
            "processes": [] if self.processes is None else self.processes.report(),
        }

    def stop(self) -> None:
        """Stop every proxy."""
        for proxy in self.proxies.values():
            proxy.stop()


def chaos_line(section: Mapping[str, Any]) -> str:
    """One line for the end of ``meshfl local``: what the chaos proxies and faults did."""
    t = section["totals"]
    parts = []
    if section["devices"]:
        parts.append(
            f"{t['publishes']} data packets to agents; {t['dropped']} dropped,"
            f" {t['duplicated']} duplicated, {t['reordered']} reordered,"
            f" {t['corrupted']} corrupted, {t['delayed']} delayed"
        )
    for p in section["partitions"]:
        parts.append(f"{p['device']} cut off for {p['seconds']:g} s after round {p['round']}")
    parts += [process_fault_line(event) for event in section.get("processes", [])]
    return "chaos: " + ("; ".join(parts) or "nothing injected")
