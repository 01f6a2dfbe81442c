"""The local PostgreSQL server of the tests: its URL, and a check that it answers.

``scripts/postgres.sh`` (run by ``scripts/test.sh``) makes sure a server answers at
:data:`PG_URL`; a test that finds none fails, saying how to start one, rather than
skipping: PostgreSQL is a supported store, so its tests are never silently left out.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_or_fail() -> str:
    """Return :data:`PG_URL` when its server answers; otherwise fail the test saying why."""
    import psycopg

    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"no PostgreSQL at {PG_URL} ({str(exc).splitlines()[0]}): run scripts/postgres.sh",
            pytrace=False,
        )
    return PG_URL


@contextmanager
def scratch_schema() -> Iterator[str]:
    """A URL of :data:`PG_URL` whose ``search_path`` is a new, empty schema, dropped after.

    Fails (with the reason) where no server answers, like :func:`postgres_or_fail`.
    """
    import sqlalchemy as sa

    postgres_or_fail()
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
