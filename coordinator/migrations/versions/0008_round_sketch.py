"""Round reports keep their count sketch in a column of its own (issue 10: memory, load).

``round_metrics.sketch`` (JSON, nullable) takes the ``"sketch"`` key out of
``round_metrics.metrics``. The sketch (``sketch_dim`` floats, ~5 KB a report at the
default) is read only for round summaries; every other read of a job's reports (the
job's page, ``/reports``, ``/ledger``, the completion and departure rules) no longer
decodes it. The data moves in SQL: ``json_extract``/``json_remove`` on SQLite, ``->`` and
``-`` on PostgreSQL's ``jsonb``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SQLITE_UP = (
    "UPDATE round_metrics SET sketch = json_extract(metrics, '$.sketch'),"
    " metrics = json_remove(metrics, '$.sketch')"
    " WHERE json_type(metrics, '$.sketch') IS NOT NULL"
)
_POSTGRES_UP = (
    "UPDATE round_metrics SET sketch = (metrics::jsonb -> 'sketch')::json,"
    " metrics = (metrics::jsonb - 'sketch')::json"
    " WHERE (metrics::jsonb -> 'sketch') IS NOT NULL"
)
_SQLITE_DOWN = (
    "UPDATE round_metrics SET metrics = json_set(metrics, '$.sketch',"
    " json(coalesce(sketch, '[]')))"
)
_POSTGRES_DOWN = (
    "UPDATE round_metrics SET metrics = jsonb_set(metrics::jsonb, '{sketch}',"
    " coalesce(sketch::jsonb, '[]'::jsonb))::json"
)


def upgrade() -> None:
    """Add ``round_metrics.sketch`` and move every stored sketch into it."""
    with op.batch_alter_table("round_metrics") as batch:
        batch.add_column(sa.Column("sketch", sa.JSON(), nullable=True))
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.execute(sa.text(_SQLITE_UP if sqlite else _POSTGRES_UP))


def downgrade() -> None:
    """Put every sketch back into ``metrics`` and drop the column."""
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.execute(sa.text(_SQLITE_DOWN if sqlite else _POSTGRES_DOWN))
    with op.batch_alter_table("round_metrics") as batch:
        batch.drop_column("sketch")
