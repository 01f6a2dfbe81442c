"""Run the coordinator's Alembic migrations programmatically (``upgrade head``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

__all__ = ["MIGRATIONS_DIR", "alembic_config", "downgrade", "upgrade"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    """Build an Alembic ``Config`` for ``coordinator/migrations`` (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision`` (default: the latest).

    Idempotent: an up-to-date database is left unchanged. Works for SQLite and
    PostgreSQL alike; a migration that moves data (0008) does it through SQLAlchemy in
    Python, not in either dialect's SQL.
    """
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database behind ``engine`` back to ``revision`` (e.g. ``"0007"``).

    For rolling back to an older release: data a newer schema keeps apart is put back
    where the older one expects it (0008: the sketches into each report's ``metrics``,
    and each job's dense W into ``jobs.topology``).
    """
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
