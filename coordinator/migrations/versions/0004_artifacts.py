"""Model artifacts: model_artifacts (device uploads and the consensus model).

Revision ID: 0004
Revises: 0003
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_artifacts",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("sources", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("model_artifacts")
