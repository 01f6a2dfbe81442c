"""What ``meshfl agent run`` was asked to do, and where an agent writes by default.

Its own module so that the daemon (which runs jobs) and the job runner (which reads the
config) both depend on it instead of on each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_OUT", "AgentConfig"]

DEFAULT_OUT = Path("meshfl-agent")
"""Where an agent writes by default (``--out``): identity key, enrolment, final models.
Ignored by git: it holds the device's private key."""


@dataclass(frozen=True)
class AgentConfig:
    """What ``meshfl agent run`` was asked to do.

    ``broker`` overrides the broker URL the coordinator advertises; ``test_data``
    overrides the job's test file; ``out`` is where final models are written;
    ``once`` exits after one job; ``poll_s`` is the assignment polling period (seconds);
    ``start_retry_s`` / ``run_retry_s`` how long (seconds) an unreachable coordinator is
    retried before enrolment / after it; ``profile_refresh_s`` how often (seconds, at
    least 60; 0 disables) a running job re-measures the link and battery between rounds
    and PUTs the profile again. The enrolment profile carries the battery figures; the
    link figures need the broker and are measured at each job's start. ``slowdown``
    (≥ 1, default 1: none) makes the job's trainer play a device that many times slower
    (:class:`edge_agent.trainer.Trainer`'s ``slowdown``; for tests and benchmarks);
    ``step_time_s`` (≥ 0 s, default 0: the real one) makes each training step last at
    least that long (the trainer's ``step_time_s``: an emulated device, W6).
    ``broker_ca`` is the PEM file of the CA of an ``mqtts://`` broker's certificate; None
    uses the one given at enrolment (saved as ``<out>/<name>.broker-ca.pem``), else the
    system's CA store. ``keepalive_s`` is the MQTT keepalive (seconds, default 30): the
    broker publishes the agent's Last Will after 1.5× this without a packet.
    ``offline_grace_s`` (seconds, ≥ 1, default 1) is how long a round keeps waiting for a
    neighbour whose Last Will came (:class:`edge_agent.engine.GossipEngine`'s).
    ``allowed_models`` are the custom model factories (``package.module:callable``) the
    device's owner allows jobs to run (``--allow-model``; the zoo is always allowed, the
    standard library never: :mod:`meshfl.modelspec.allow`); ``data_dir`` is the folder a
    job's test data must lie in (default: the folder holding ``data``).
    ``coordinator_ca`` is the PEM CA of an ``https://`` coordinator's certificate (None:
    the system's store); ``insecure_http`` allows ``http://`` to a host that is not
    loopback (:func:`meshfl.coordinator_url.http_verify`).
    """

    coordinator: str
    token: str
    data: Path
    name: str
    broker: str | None = None
    test_data: Path | None = None
    out: Path = DEFAULT_OUT
    label_column: str = "label"
    once: bool = False
    poll_s: float = 0.5
    start_retry_s: float = 10.0
    run_retry_s: float = 120.0
    threads: int = 1
    profile_refresh_s: float = 300.0
    slowdown: float = 1.0
    step_time_s: float = 0.0
    broker_ca: Path | None = None
    keepalive_s: int = 30
    offline_grace_s: float = 1.0
    allowed_models: tuple[str, ...] = ()
    data_dir: Path | None = None
    coordinator_ca: Path | None = None
    insecure_http: bool = False

    @property
    def data_root(self) -> Path:
        """The device's data directory: ``data_dir``, else the folder holding ``data``."""
        return Path(self.data_dir or Path(self.data).resolve().parent)
