"""Round reports keep their count sketch in a column of its own (issue 10: memory, load).

``round_metrics.sketch`` (JSON, nullable) takes the ``"sketch"`` key out of
``round_metrics.metrics``. The sketch (``sketch_dim`` floats, ~5 KB a report at the
default) is read only for round summaries; every other read of a job's reports (the
job's page, ``/reports``, ``/ledger``, the completion and departure rules) no longer
decodes it. The reports are rewritten in Python, 1,000 at a time by id, on both databases
alike: PostgreSQL's JSON functions refuse strings its ``json`` type stores (a ``\u0000``
escape in a device-sent field), so the move is not done in SQL.

The same release stopped storing the dense mixing matrix ``"W"`` in ``jobs.topology``
(it is derived from the edges). Releases before 0008 read it, so the downgrade writes it
back, computed from each topology's edges and mixing rule as they did.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op

from meshfl.topology import Graph, mixing_matrix

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BATCH = 1000
_REPORTS = sa.table(
    "round_metrics",
    sa.column("id", sa.Integer),
    sa.column("metrics", sa.JSON),
    sa.column("sketch", sa.JSON),
)
Change = Callable[[Any, Any], "tuple[Any, Any] | None"]


def upgrade() -> None:
    """Add ``round_metrics.sketch`` and move every stored sketch into it."""
    with op.batch_alter_table("round_metrics") as batch:
        batch.add_column(sa.Column("sketch", sa.JSON(), nullable=True))
    _rewrite(op.get_bind(), _take_sketch)


def downgrade() -> None:
    """Put every sketch back into ``metrics``, drop the column, store each job's W again."""
    _rewrite(op.get_bind(), _give_sketch)
    with op.batch_alter_table("round_metrics") as batch:
        batch.drop_column("sketch")
    _store_dense_w(op.get_bind())


def _take_sketch(metrics: Any, sketch: Any) -> tuple[Any, Any] | None:
    if not isinstance(metrics, dict) or "sketch" not in metrics:
        return None
    rest = dict(metrics)
    return rest, rest.pop("sketch")


def _give_sketch(metrics: Any, sketch: Any) -> tuple[Any, Any] | None:
    return {**(metrics or {}), "sketch": [] if sketch is None else sketch}, sketch


def _rewrite(bind: sa.Connection, change: Change) -> None:
    """Apply ``change(metrics, sketch)`` to every report (``None``: leave it), by id."""
    update = (
        _REPORTS.update()
        .where(_REPORTS.c.id == sa.bindparam("rid"))
        .values(
            metrics=sa.bindparam("new_metrics", type_=sa.JSON),
            sketch=sa.bindparam("new_sketch", type_=sa.JSON),
        )
    )
    last = -1
    while True:
        query = sa.select(_REPORTS.c.id, _REPORTS.c.metrics, _REPORTS.c.sketch)
        rows = bind.execute(
            query.where(_REPORTS.c.id > last).order_by(_REPORTS.c.id).limit(_BATCH)
        ).all()
        if not rows:
            return
        changed = []
        for rid, metrics, sketch in rows:
            new = change(metrics, sketch)
            if new is not None:
                changed.append({"rid": rid, "new_metrics": new[0], "new_sketch": new[1]})
        if changed:
            bind.execute(update, changed)
        last = rows[-1][0]


def _store_dense_w(bind: sa.Connection) -> None:
    """Write ``"W"`` into every stored topology that lacks it (what releases < 0008 read)."""
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("topology", sa.JSON))
    for job_id, topology in bind.execute(sa.select(jobs.c.id, jobs.c.topology)).all():
        if not topology or "W" in topology or "edges" not in topology:
            continue
        edges = frozenset((min(int(i), int(j)), max(int(i), int(j))) for i, j in topology["edges"])
        rule = str(topology.get("params", {}).get("mixing", "metropolis-hastings"))
        w = mixing_matrix(Graph(len(topology["devices"]), edges), rule)
        stored = {**topology, "W": [[float(x) for x in row] for row in w]}
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(topology=stored))
