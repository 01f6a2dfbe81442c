"""Capability profile history: device_profiles.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_profiles",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
    )
    op.create_index(
        "ix_device_profiles_device_id_received_at",
        "device_profiles",
        ["device_id", "received_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_device_profiles_device_id_received_at", table_name="device_profiles")
    op.drop_table("device_profiles")
