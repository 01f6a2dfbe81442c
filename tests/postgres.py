"""The local PostgreSQL server of the tests: its URL, and the one rule for skipping.

Tests skip, saying why, only where no server answers at :data:`PG_URL`; a missing
driver (psycopg is a dev dependency) is a broken install and fails instead.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_or_skip() -> str:
    """Return :data:`PG_URL` when its server answers; otherwise skip the test with the reason."""
    import psycopg  # a missing driver is a broken install: fail, don't skip

    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {PG_URL}: {str(exc).splitlines()[0]}")
    return PG_URL


@contextmanager
def scratch_schema() -> Iterator[str]:
    """A URL of :data:`PG_URL` whose ``search_path`` is a new, empty schema, dropped after.

    Skips (with the reason) where no server answers, like :func:`postgres_or_skip`.
    """
    import sqlalchemy as sa

    postgres_or_skip()
    schema = f"meshfl_test_{secrets.token_hex(4)}"
    admin = sa.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        try:
            yield f"{PG_URL}?options=-csearch_path%3D{schema}"
        finally:
            with admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()
