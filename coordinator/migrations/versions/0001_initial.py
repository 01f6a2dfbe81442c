"""Initial schema: devices, jobs, job_devices, round_metrics.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("fleet", sa.String(200), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("enrolled_at", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_devices_enrolled_at", "devices", ["enrolled_at"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("topology", sa.JSON(), nullable=True),
    )
    op.create_table(
        "job_devices",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.Column("final", sa.JSON(), nullable=True),
        sa.Column("last_activity", sa.Double(), nullable=False),
    )
    op.create_table(
        "round_metrics",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.UniqueConstraint("job_id", "device_id", "round", name="uq_round_metrics"),
    )


def downgrade() -> None:
    op.drop_table("round_metrics")
    op.drop_table("job_devices")
    op.drop_table("jobs")
    op.drop_index("ix_devices_enrolled_at", table_name="devices")
    op.drop_table("devices")
