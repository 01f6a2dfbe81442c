"""Topology churn: job_devices.joined_round and job_devices.left_round.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER a table's columns in place (PostgreSQL runs plain ALTERs).
    with op.batch_alter_table("job_devices") as batch:
        batch.add_column(
            sa.Column("joined_round", sa.Integer(), nullable=False, server_default="1")
        )
        batch.add_column(sa.Column("left_round", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_devices") as batch:
        batch.drop_column("left_round")
        batch.drop_column("joined_round")
