"""Many agents in one process: the in-process mode behind ``meshfl agent fleet``.

Each agent is a thread running :func:`edge_agent.daemon.run_agent` with its own
:class:`~edge_agent.daemon.AgentConfig` (name, data file), so everything that makes it a
device is its own: its Ed25519 identity key, its enrolment and REST client (its device
token), its MQTT client (client id = its device id, its own persistent session, its Last
Will), its health file, checkpoints and final models (all named after the agent under
``out``, as for agent processes sharing ``--out``). What the agents share is the process:
one Python interpreter, one torch, one set of loaded modules. That is the point (a few
hundred agents on one machine) and the constraint: the process-global parts of an agent
are handled here, not in the daemon.

- **Signals.** Only the main thread can install a handler; ``meshfl agent fleet``
  installs one for SIGTERM that ends the process at once (``os._exit``: finalising an
  interpreter under a hundred busy threads took seconds). The agent threads are daemon
  threads; each agent's TCP connection closes and the broker publishes its Last Will
  ``offline``.
- **``sys.exit`` and exceptions.** The daemon raises (never exits); whatever an agent's
  thread raises (``SystemExit`` and ``KeyboardInterrupt`` included) is caught in that
  thread and recorded as that agent's failure: the other agents go on.
- **torch threads.** ``torch.set_num_threads`` is process-wide: every agent of a fleet
  must ask for the same number (default 1), or :func:`run_fleet` refuses.
- **Random generators.** The trainer and the model zoo draw from their own
  ``torch.Generator``; nothing an agent runs seeds or draws from a global generator.
- **ONNX export.** torch's exporter keeps module-global state;
  :func:`models.onnx.export_bytes` serialises exports with a lock.
- **Logging.** The device and job of a record are context variables, bound per thread by
  the daemon (:mod:`meshfl.logcontext`); each thread is named after its agent, so a text
  log line can show which agent wrote it (``%(threadName)s``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edge_agent.daemon import AgentConfig, run_agent
from meshfl.errors import ConfigError
from meshfl.wire import validate_id

__all__ = ["MAX_FLEET", "AgentOutcome", "fleet_configs", "run_fleet"]

log = logging.getLogger("meshfl.agent.fleet")

MAX_FLEET = 1024
"""Most agents one process runs (each holds three or four threads: its own, paho's
network loop, its health writer, a reporter while a job runs)."""


@dataclass(frozen=True)
class AgentOutcome:
    """How one agent of a fleet ended: ``error`` None when it returned normally.

    ``error`` is ``"ExceptionName: message"``; ``seconds`` the agent's run time.
    """

    name: str
    error: str | None
    seconds: float


def fleet_configs(
    template: AgentConfig, names: Sequence[str], data: Sequence[Path]
) -> list[AgentConfig]:
    """One config per agent: ``template`` with each agent's ``name`` and ``data`` file.

    Raises
    ------
    meshfl.errors.ConfigError
        No names, more than :data:`MAX_FLEET`, a name given twice or not a valid id, or
        ``data`` not as long as ``names``.

    """
    if not 1 <= len(names) <= MAX_FLEET:
        raise ConfigError(f"a fleet runs 1 to {MAX_FLEET} agents (got {len(names)})")
    if len(set(names)) != len(names):
        raise ConfigError("every agent of a fleet needs its own name")
    if len(data) != len(names):
        raise ConfigError(f"{len(names)} agents but {len(data)} data files")
    for name in names:
        validate_id(name, "device name")
    return [replace(template, name=n, data=Path(d)) for n, d in zip(names, data, strict=True)]


def run_fleet(
    configs: Sequence[AgentConfig],
    *,
    stagger_s: float = 0.0,
    run: Callable[[AgentConfig], None] = run_agent,
    on_end: Callable[[AgentOutcome], None] | None = None,
) -> list[AgentOutcome]:
    """Run each config's agent in its own thread of this process until all have ended.

    Parameters
    ----------
    configs : sequence of AgentConfig
        One per agent (:func:`fleet_configs`); names unique, the same ``threads``.
    stagger_s : float, default 0.0
        Seconds between two agents' starts (spreads enrolment over the coordinator).
    run : callable, default :func:`edge_agent.daemon.run_agent`
        What each thread runs with its config (tests pass a fake).
    on_end : callable or None
        Called from each agent's thread with its outcome as it ends.

    Returns
    -------
    list of AgentOutcome
        In the order of ``configs``. A failed agent never stops the others.

    Raises
    ------
    meshfl.errors.ConfigError
        Names repeated, different ``threads`` (process-wide in torch), or a negative
        ``stagger_s``.

    """
    if len({c.name for c in configs}) != len(configs):
        raise ConfigError("every agent of a fleet needs its own name")
    if len({c.threads for c in configs}) > 1:
        raise ConfigError("torch threads are process-wide: give every agent the same --threads")
    if not stagger_s >= 0:
        raise ConfigError(f"stagger_s must be >= 0 seconds (got {stagger_s})")
    outcomes: dict[str, AgentOutcome] = {}

    def one(config: AgentConfig) -> None:
        began = time.monotonic()
        error = None
        try:
            run(config)
        except BaseException as exc:  # one agent's end (even SystemExit) must not end the fleet
            error = f"{type(exc).__name__}: {exc}"
            log.error("agent %s failed: %s", config.name, error)
        outcome = AgentOutcome(config.name, error, time.monotonic() - began)
        outcomes[config.name] = outcome
        if on_end is not None:
            on_end(outcome)

    threads = []
    for i, config in enumerate(configs):
        if i and stagger_s:
            time.sleep(stagger_s)
        thread = threading.Thread(target=one, args=(config,), name=config.name, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        while thread.is_alive():  # a timed join: the main thread still takes signals
            thread.join(0.5)
    return [outcomes[c.name] for c in configs]
