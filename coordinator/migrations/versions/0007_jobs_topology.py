"""Job control and fleet topology (issue 6): paused jobs and the fleet's default topology.

Adds ``jobs.pause_round`` (the first round held back while a job is paused) and the
``fleet_settings`` key/value table (the default topology lives under ``"topology"``).
Device selection needs no schema: ``select`` is part of the stored job spec.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``jobs.pause_round`` and the ``fleet_settings`` table."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pause_round", sa.Integer(), nullable=True))
    op.create_table(
        "fleet_settings",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    """Drop what :func:`upgrade` added."""
    op.drop_table("fleet_settings")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pause_round")
