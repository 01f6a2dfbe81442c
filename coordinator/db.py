"""SQLAlchemy 2.x ORM tables of the coordinator and the engine factory.

Times are unix seconds (``float``) taken from the app's injectable clock, so tests can
move time; JSON columns hold the REST contract's ``TypedDict`` bodies unchanged. The
schema is created by the Alembic migrations in ``coordinator/migrations`` — never by
``metadata.create_all`` — and a test checks that they agree with these classes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool

from meshfl.files import private_file

__all__ = [
    "ApiToken",
    "Base",
    "CoordinatorKey",
    "Device",
    "DeviceProfile",
    "EnrolmentToken",
    "FleetEnrolment",
    "FleetSetting",
    "Job",
    "JobDevice",
    "ModelArtifact",
    "PrivacySpendRecord",
    "RoundMetric",
    "SecAggBundle",
    "SecAggDeclaration",
    "make_engine",
    "make_sessionmaker",
]


class Base(DeclarativeBase):
    """Declarative base; ``Base.metadata`` is what the migrations must produce."""


class Device(Base):
    """An enrolled device; ``token_hash`` is the SHA-256 hex digest of its bearer token."""

    __tablename__ = "devices"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    fleet: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    enrolled_at: Mapped[float] = mapped_column(Double, index=True)
    last_seen: Mapped[float] = mapped_column(Double)
    # Ed25519 identity public key, raw 32 bytes in base64 (None: enrolled without one).
    identity_key: Mapped[str | None] = mapped_column(String(64))
    # Fleet management (issue 6): operator-set tags and labels; lifecycle state
    # "active" | "draining" (finishes its current round, takes no new work) | "revoked"
    # | "deleted" (a tombstone kept for its job history; coordinator.fleet).
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="active", server_default="active")
    revoked_at: Mapped[float | None] = mapped_column(Double)


class DeviceProfile(Base):
    """One capability profile a device reported (its history; ``devices.profile`` is the latest)."""

    __tablename__ = "device_profiles"
    __table_args__ = (
        Index("ix_device_profiles_device_id_received_at", "device_id", "received_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"))
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)  # a CapabilityProfile
    received_at: Mapped[float] = mapped_column(Double)


class Job(Base):
    """A training job: its ``JobSpec``, status and, once started, its topology."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float | None] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    # The current version: {"kind", "params", "devices": [ids by position], "edges":
    # [[i, j]], "gap", "version", "from_round", "events", "plan", "sit_out"}
    # (coordinator.planning documents it; rows from before topology versions lack the
    # last five keys and read as version 1; older rows also hold a dense "W", unused).
    topology: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # While paused (issue 6): the first round devices must not start (None otherwise).
    pause_round: Mapped[int | None] = mapped_column(Integer)


class FleetSetting(Base):
    """One fleet-wide setting by ``name``, its value a JSON document (issue 6).

    ``"topology"`` holds the default :class:`~meshfl.contract.TopologySetting` of jobs
    created without a ``topology``; no row: the built-in default.
    """

    __tablename__ = "fleet_settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Double)


class JobDevice(Base):
    """A device's participation in a job: its stable index, rounds, and whether it is done.

    ``index`` never changes (agents seed their data shuffles with it); the device's
    position in the current W is its place in ``jobs.topology["devices"]``.
    ``joined_round`` is the first round it runs (1, or later for a device that joined a
    running job); ``left_round`` the first round it no longer takes part in (``None``:
    it stayed). ``last_activity`` is when it last reported or asked for its assignment.
    """

    __tablename__ = "job_devices"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer)
    done: Mapped[bool] = mapped_column(Boolean, default=False)
    final: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the DeviceDone body
    last_activity: Mapped[float] = mapped_column(Double)
    joined_round: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    left_round: Mapped[int | None] = mapped_column(Integer)


class RoundMetric(Base):
    """One device's ``RoundMetrics`` for one round; the first report of a round wins."""

    __tablename__ = "round_metrics"
    __table_args__ = (UniqueConstraint("job_id", "device_id", "round", name="uq_round_metrics"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"))
    round: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)  # the report less its sketch
    received_at: Mapped[float] = mapped_column(Double)
    # The report's count sketch (``sketch_dim`` floats; migration 0008 moved it out of
    # ``metrics``): only round summaries read it, and at ~5 KB a report it outweighed the
    # rest of every load of a job's reports. Loaded on request only (``undefer``); reading
    # it on a row loaded without raises instead of querying once per row.
    sketch: Mapped[list[float] | None] = mapped_column(JSON, deferred=True, deferred_raiseload=True)


class ModelArtifact(Base):
    """A model file of a job kept under the coordinator's ``artifacts_dir`` (not in the DB).

    ``name`` is the uploading device's id, or ``"consensus"`` for the parameter mean of
    the job's device models. ``sha256`` / ``size_bytes`` describe the file (``None`` for a
    consensus that could not be built: ``error`` says why); ``sources`` of a consensus maps
    each averaged device id to the sha256 of the model it averaged.
    """

    __tablename__ = "model_artifacts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    sha256: Mapped[str | None] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Double)
    sources: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(String(1000))


class SecAggBundle(Base):
    """A device's :class:`~meshfl.contract.KeyBundle` for a secure job (verified on upload)."""

    __tablename__ = "secagg_bundles"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"), primary_key=True)
    bundle: Mapped[dict[str, Any]] = mapped_column(JSON)
    received_at: Mapped[float] = mapped_column(Double)


class SecAggDeclaration(Base):
    """The first declaration of an aggregator for a round, and the coordinator's signature.

    ``body`` is the :class:`~meshfl.contract.Declaration` exactly as signed; ``signature``
    is Ed25519 over its canonical JSON, base64.
    """

    __tablename__ = "secagg_declarations"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True)
    aggregator: Mapped[str] = mapped_column(ForeignKey("devices.id"), primary_key=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    signature: Mapped[str] = mapped_column(String(128))
    declared_at: Mapped[float] = mapped_column(Double)


class PrivacySpendRecord(Base):
    """DP releases of one device in one round of a job, with the job's σ and δ.

    The accountant (:mod:`coordinator.privacy`) composes ``releases`` Gaussian mechanisms
    of noise multiplier ``noise_multiplier`` per row; one row per (job, device, round).
    ``unit`` ``record`` (issue 22): ``releases`` DP-SGD steps, each Poisson-sampled at
    ``sampling_rate`` (1.0 for device-level rows).
    """

    __tablename__ = "privacy_spend"
    __table_args__ = (UniqueConstraint("job_id", "device_id", "round", name="uq_privacy_spend"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"), index=True)
    round: Mapped[int] = mapped_column(Integer)
    releases: Mapped[int] = mapped_column(Integer)
    noise_multiplier: Mapped[float] = mapped_column(Double)
    delta: Mapped[float] = mapped_column(Double)
    at: Mapped[float] = mapped_column(Double)
    unit: Mapped[str] = mapped_column(String(16), default="device", server_default="device")
    sampling_rate: Mapped[float] = mapped_column(Double, default=1.0, server_default="1.0")


class CoordinatorKey(Base):
    """A key of the coordinator itself: ``"signing"`` is its Ed25519 declaration key.

    ``private_key`` is the raw 32-byte private key in base64, created once and kept for
    the life of the database (devices pin its public key from the directory).
    """

    __tablename__ = "coordinator_keys"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    private_key: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Double)


class ApiToken(Base):
    """An operator's REST API token (issue 6); :mod:`coordinator.tokens` manages them.

    ``role`` is ``"admin"``, ``"operator"`` or ``"read-only"``; ``token_hash`` is the
    SHA-256 hex digest of the secret, which is shown once at creation. ``expires_at``
    ``None``: never expires; ``revoked_at`` is set when an admin revokes it (the row stays
    so the token is refused as *revoked*, not unknown).
    """

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)


class EnrolmentToken(Base):
    """A token devices enrol with (issue 6): short-lived, ``uses`` enrolments at most.

    ``uses_left`` counts down (atomically, :func:`coordinator.tokens.consume_enrolment_token`);
    ``tags`` are given to every device enrolled with it; ``token_hash`` is the SHA-256 hex
    digest of the secret, shown once at creation.
    """

    __tablename__ = "enrolment_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    tags: Mapped[list[str]] = mapped_column(JSON)
    uses: Mapped[int] = mapped_column(Integer)
    uses_left: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)


class FleetEnrolment(Base):
    """The fleet's shared enrolment token (issue 23): disabled, rotated, expiring, counted.

    One row per fleet (:mod:`coordinator.enrolment`). ``token_hash`` is the current
    secret's SHA-256 hex digest; ``seed_hash`` that of the ``--enrol-token`` setting that
    seeded the row (``None``: made by a rotation); ``uses``/``uses_left`` ``None``:
    unlimited; ``expires_at`` ``None``: never; ``disabled_at`` set: refused.
    """

    __tablename__ = "fleet_enrolment"

    fleet: Mapped[str] = mapped_column(String(200), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    seed_hash: Mapped[str | None] = mapped_column(String(64))
    uses: Mapped[int | None] = mapped_column(Integer)
    uses_left: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double)
    disabled_at: Mapped[float | None] = mapped_column(Double)


THREADS = 40
"""Threads serving sync routes (anyio's default limiter); the pool holds as many connections."""


def make_engine(url: str) -> Engine:
    """Create the engine for ``url`` (SQLite or PostgreSQL).

    A plain ``postgresql://`` URL uses the psycopg (3) driver. SQLite gets
    ``check_same_thread=False`` (FastAPI serves sync routes from a thread
    pool), foreign keys switched on, and a single shared connection for ``:memory:``.
    A SQLite file is created 0600 (it holds token hashes and the declaration-signing
    key; :func:`meshfl.files.private_file`) and put in write-ahead-log mode with
    ``synchronous=NORMAL`` (SQLite's
    recommended setting for concurrent use, https://sqlite.org/wal.html): readers do not
    block the writer, and a commit appends to the ``-wal`` file without an fsync, so a
    fleet's round reports and polls do not queue behind each other's disk flushes. A
    power cut may lose the last commits, never the database's consistency.
    Pooled engines hold up to :data:`THREADS` connections, one per request thread.
    """
    parsed = make_url(url)
    if parsed.drivername == "postgresql":  # meshfl ships psycopg 3, not psycopg2
        parsed = parsed.set(drivername="postgresql+psycopg")
    # As many connections as FastAPI has threads for sync routes (anyio's default 40):
    # a smaller pool lets requests that hold a connection wait for a thread while the
    # threads wait for a connection, until the pool times out with 500s.
    pool = {"pool_size": 10, "max_overflow": THREADS - 10}
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True, **pool)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    if parsed.database in (None, "", ":memory:"):
        kwargs["poolclass"] = StaticPool
    else:
        kwargs.update(pool)
        if not parsed.database.startswith("file:"):  # it holds secrets: owner-only (0600)
            private_file(parsed.database)
    engine = create_engine(parsed, **kwargs)
    in_file = "poolclass" not in kwargs

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        if in_file:  # readers never wait for the writer; a commit appends, no fsync
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Session factory; objects stay readable after commit (``expire_on_commit=False``)."""
    return sessionmaker(engine, expire_on_commit=False)
