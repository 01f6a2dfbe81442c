"""Fleet management and auth (issue 6): API tokens, enrolment tokens, device tags,
labels and states, broker logins.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("labels", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(
            sa.Column("state", sa.String(16), nullable=False, server_default="active")
        )
        batch.add_column(sa.Column("revoked_at", sa.Double(), nullable=True))
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_table(
        "enrolment_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("uses_left", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.UniqueConstraint("token_hash"),
    )


def downgrade() -> None:
    op.drop_table("enrolment_tokens")
    op.drop_table("api_tokens")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("state")
        batch.drop_column("labels")
        batch.drop_column("tags")
