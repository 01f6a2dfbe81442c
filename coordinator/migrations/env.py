"""Alembic environment of the coordinator store.

Run programmatically by :func:`coordinator.migrate.upgrade` (the app's own connection is
passed in ``config.attributes["connection"]``), or from a shell::

    MESHFL_COORDINATOR_DB_URL=sqlite:///meshfl-coordinator.db \
        alembic -c coordinator/migrations/alembic.ini upgrade head
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from coordinator.db import Base, make_engine

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate over the given connection, or one opened from the configured URL."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get(
        "MESHFL_COORDINATOR_DB_URL", "sqlite:///meshfl-coordinator.db"
    )
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
