"""Privacy (issue 5): device identity keys, secure-aggregation bundles and declarations,
DP spend per (job, device, round), the coordinator's own signing key.

Revision ID: 0005
Revises: 0004
Create Date: 2025-01-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER a table's columns in place (PostgreSQL runs plain ALTERs).
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("identity_key", sa.String(64), nullable=True))
    op.create_table(
        "secagg_bundles",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("bundle", sa.JSON(), nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "secagg_declarations",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("round", sa.Integer(), primary_key=True),
        sa.Column("aggregator", sa.String(32), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.Column("declared_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "privacy_spend",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("releases", sa.Integer(), nullable=False),
        sa.Column("noise_multiplier", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.UniqueConstraint("job_id", "device_id", "round", name="uq_privacy_spend"),
    )
    op.create_index("ix_privacy_spend_device_id", "privacy_spend", ["device_id"])
    op.create_table(
        "coordinator_keys",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("private_key", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("coordinator_keys")
    op.drop_index("ix_privacy_spend_device_id", table_name="privacy_spend")
    op.drop_table("privacy_spend")
    op.drop_table("secagg_declarations")
    op.drop_table("secagg_bundles")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("identity_key")
