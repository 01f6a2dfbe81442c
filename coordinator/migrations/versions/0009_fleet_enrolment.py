"""The fleet's shared enrolment token lives in the store: disable, rotate, expire, count.

Until 0009 the fleet enrolment token was only a setting (``--enrol-token``) compared at
each enrolment: it never expired, could not be revoked, and enrolled any number of
devices (issue 23). ``fleet_enrolment`` holds one row per fleet: the SHA-256 digest of
the current secret, the digest of the setting that seeded it (so a restart with the
same ``--enrol-token`` does not undo a rotation or a disable), an optional quota
(``uses``/``uses_left``; NULL: unlimited), an optional expiry and the time it was
disabled. No existing data moves: a coordinator started with ``--enrol-token`` seeds
the row at start (:func:`coordinator.enrolment.seed`).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_enrolment",
        sa.Column("fleet", sa.String(200), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("seed_hash", sa.String(64), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=True),
        sa.Column("uses_left", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("disabled_at", sa.Double(), nullable=True),
    )


def downgrade() -> None:
    """Drop the table: releases before 0009 read the token from their settings again."""
    op.drop_table("fleet_enrolment")
