"""Coordinator settings, read from ``MESHFL_COORDINATOR_*`` environment variables.

Nothing is created at import time: build a :class:`CoordinatorSettings` where the
process starts (``serve()``, the CLI, a test) and pass it to ``create_app(settings)``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["CoordinatorSettings"]


class CoordinatorSettings(BaseSettings):
    """Settings of one coordinator process.

    Attributes
    ----------
    db_url : str
        SQLAlchemy URL of the store. Default ``sqlite:///meshfl-coordinator.db`` (a file in
        the working directory); ``postgresql+psycopg://user@host/db`` for PostgreSQL.
    fleet : str
        Name of the fleet this coordinator manages; returned to devices at enrolment and
        used in their MQTT topics. Default ``"default"``.
    enrol_token : str or None
        The fleet's shared enrolment token (:mod:`coordinator.enrolment`). ``None``
        (default): off — devices enrol with operator-made enrolment tokens, or one an
        operator rotates in (``POST /enrolment-tokens/fleet/rotate``). Given: seeded at
        start; operators can disable and rotate it.
    enrol_token_ttl_s : float or None
        Seconds the seeded fleet token stays valid from its seeding. ``None`` (default):
        no expiry.
    enrol_token_uses : int or None
        Devices the seeded fleet token may enrol. ``None`` (default): unlimited.
    admin_token : str or None
        Bearer token of the admin (operator) endpoints. ``None``: ``serve()`` generates
        one at startup with :func:`secrets.token_urlsafe` and prints it once.
    broker_url : str or None
        MQTT broker URL advertised to devices at enrolment (``mqtt://host:1883``).
        ``None``: devices must be told the broker some other way.
    stale_after_s : float
        Seconds. A participant that has not reported for this long, while at least one
        other participant has finished, is declared lost and the job completes without
        it. Default 120.
    live_within_s : float
        Seconds. A job starts only on devices heard from this recently and not busy in
        another running job (idle agents poll for work twice a second). Default 15.
    depart_after_s : float
        Seconds. A participant of a running job that has neither reported a round nor
        asked for its assignment for this long, while another participant did, leaves the
        job: the topology is re-planned without it. Default 60.
    depart_evidence_s : float
        Seconds. A participant that every current neighbour listed as ``missing`` in each
        of their latest 2 round reports leaves once it has been silent for this long (or
        twice its latest reported round time, whichever is longer): a killed agent leaves
        within a few rounds. A live agent asks for its assignment every ``poll_s`` (0.5 s)
        while it runs a job, so 1.5 s of silence is three missed polls. Default 1.5.
    departure_check_s : float
        Seconds. The departure rules of a running job (``depart_*``) are evaluated at most
        this often per coordinator process, not on every poll and report: with N devices
        each rule pass costs O(N) queries and a fleet polls O(N) times a second. A
        departure is then seen at most this much later. 0: on every request. Default 0.5.
    depart_at_end_s : float
        Seconds. Once every other participant is done, one silent this long leaves (it
        died near the end, or its coordinator link did: 20 missed polls), and the job
        completes. Default 10.
    artifacts_dir : Path or None
        Directory of the model files devices upload (``publish_model`` jobs) and of the
        consensus models built from them: ``{artifacts_dir}/{job_id}/{name}.onnx``.
        ``None`` (default): ``{db stem}-artifacts`` next to a SQLite database file, or
        ``meshfl-artifacts`` in the working directory for PostgreSQL and in-memory SQLite.
    max_model_bytes : int
        Bytes. Largest model upload accepted (413 beyond). Default 64 MiB.
    metrics_public : bool
        Serve Prometheus ``/metrics`` without a token (for a scraper on a trusted
        network). Default ``False``: it needs an operator token (any role).
    heartbeat_flush_s : float
        Seconds. Heartbeat times are kept in memory and written to ``devices.last_seen``
        this often (and at shutdown); readers see the fresher value meanwhile
        (:mod:`coordinator.liveness`). Default 1.
    broker_ca_file : Path or None
        PEM file of the CA that signed the broker's TLS certificate; its text is returned
        to each enrolling device as ``broker_ca``. ``None`` (default): none is returned.
    tls_cert, tls_key : Path or None
        PEM certificate (chain) and private key ``meshfl coordinator serve`` serves HTTPS
        with (``--tls-cert``/``--tls-key``). ``None`` (default): plain HTTP, which clients
        accept only on loopback (:mod:`meshfl.coordinator_url`).
    rate_limit_operator, rate_limit_device, rate_limit_heartbeat, rate_limit_enrol : str
        Requests allowed per identity on ``/api/v1`` (:mod:`coordinator.ratelimit`), in the
        ``limits`` notation (``"600/minute"``, ``"10/second;500/minute"``); ``""`` or
        ``"0"``: unlimited. Per API token (or the admin token), default ``600/minute``;
        per device token, default ``1200/minute``; per device on its heartbeat route, a
        budget of its own, default ``1200/minute`` and never below 10/s; per client
        address for requests without a bearer token (enrolment), default ``30/minute``.

    """

    model_config = SettingsConfigDict(env_prefix="MESHFL_COORDINATOR_", extra="ignore")

    db_url: str = "sqlite:///meshfl-coordinator.db"
    fleet: str = "default"
    enrol_token: str | None = None
    enrol_token_ttl_s: float | None = Field(default=None, gt=0)
    enrol_token_uses: int | None = Field(default=None, ge=1)
    admin_token: str | None = None
    broker_url: str | None = None
    stale_after_s: float = Field(default=120.0, gt=0)
    live_within_s: float = Field(default=15.0, gt=0)
    depart_after_s: float = Field(default=60.0, gt=0)
    depart_evidence_s: float = Field(default=1.5, gt=0)
    depart_at_end_s: float = Field(default=10.0, gt=0)
    departure_check_s: float = Field(default=0.5, ge=0)
    artifacts_dir: Path | None = None
    max_model_bytes: int = Field(default=64 << 20, gt=0)
    metrics_public: bool = False
    heartbeat_flush_s: float = Field(default=1.0, gt=0)
    broker_ca_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    rate_limit_operator: str = "600/minute"
    rate_limit_device: str = "1200/minute"
    rate_limit_heartbeat: str = "1200/minute"
    rate_limit_enrol: str = "30/minute"

    @field_validator(
        "rate_limit_operator", "rate_limit_device", "rate_limit_heartbeat", "rate_limit_enrol"
    )
    @classmethod
    def _rate_limit(cls, value: str, info: ValidationInfo) -> str:
        from limits import parse_many

        text = value.strip()
        if text in ("", "0"):
            return text
        try:
            items = parse_many(text)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a rate limit; write e.g. '600/minute' or '' for none"
            ) from None
        if info.field_name == "rate_limit_heartbeat" and any(
            item.amount < 10 * item.get_expiry() for item in items
        ):
            raise ValueError(f"{value!r} allows under 10 heartbeats/s; allow at least that")
        return text

    def artifacts_path(self) -> Path:
        """The artifacts directory: ``artifacts_dir``, or its default next to the database."""
        if self.artifacts_dir is not None:
            return self.artifacts_dir
        from sqlalchemy.engine import make_url

        url = make_url(self.db_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            db = Path(url.database)
            return db.with_name(f"{db.stem}-artifacts")
        return Path("meshfl-artifacts")
