"""Record-level DP spends (issue 22): each spend row names its unit and sampling rate.

``privacy_spend.unit`` (``device`` or ``record``) and ``privacy_spend.sampling_rate``
(Poisson rate q of a record-level row's DP-SGD steps). Rows written before 0010 are
device-level releases at rate 1, which the server defaults give them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("privacy_spend") as batch:
        batch.add_column(
            sa.Column("unit", sa.String(16), nullable=False, server_default="device")
        )
        batch.add_column(
            sa.Column("sampling_rate", sa.Double(), nullable=False, server_default="1.0")
        )


def downgrade() -> None:
    """Drop the columns: releases before 0010 account every row as device-level."""
    with op.batch_alter_table("privacy_spend") as batch:
        batch.drop_column("sampling_rate")
        batch.drop_column("unit")
