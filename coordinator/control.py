"""The control topic: the coordinator pushes each topology version to the agents.

On every new topology version of a job (version 1 at start, then one per join or leave)
and when a job ends, the coordinator publishes one retained JSON message on
``meshfl/v1/{fleet}/control`` (:func:`meshfl.wire.control_topic`)::

    {"job": "job-…", "version": 3, "from_round": 9, "kind": "ring",
     "devices": ["dev-a", …], "edges": [[0, 1], …], "status": "running"}

A pause and a resume are announced too (same version, ``status`` ``"paused"`` with
``"pause_round"``: the first round held back, then ``"running"`` again).

``kind`` is the topology kind, ``devices`` the version's devices by position and
``edges`` its graph as sorted ``[i, j]`` position pairs (``i < j``). The message does not
carry the mixing matrix: W is :func:`meshfl.topology.mixing_matrix` of that graph under
the job's ``mixing`` rule, which every agent already has from its assignment, so each
agent computes its own row. A dense W is N² numbers sent to N agents, O(N³) broker bytes
per announcement (about 70 MB at 256 devices); the edges are N·d/2 pairs. Retained, so
an agent that subscribes late still gets the latest version; agents also poll ``GET
/devices/{id}/assignment`` every round, so a lost message only delays a change. The
publisher is injected (``create_app(settings, publish)``): the coordinator itself never
imports an MQTT client. A failing publish is logged and never fails the request that
caused it.

The bytes are :func:`meshfl.wire.control.encode_control`'s (the one encoder; agents
decode with :func:`~meshfl.wire.control.decode_control`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.db import Job
from meshfl.wire import control_topic
from meshfl.wire.control import ControlMessage, encode_control

__all__ = ["Control", "Publish", "control_message"]

log = logging.getLogger("coordinator.control")

Publish = Callable[[str, bytes], None]
"""``publish(topic, payload)``: send one retained message (QoS 1) to the broker."""


def control_message(job: Job) -> ControlMessage:
    """The control message of ``job``'s current topology version (the job must be started)."""
    topo: dict[str, Any] = job.topology or {}
    return ControlMessage(
        job=job.id,
        version=int(topo.get("version", 1)),
        from_round=int(topo.get("from_round", 1)),
        kind=topo.get("kind"),
        devices=tuple(topo.get("devices", [])),
        edges=tuple((int(i), int(j)) for i, j in topo.get("edges", [])),
        status=job.status,
        pause_round=job.pause_round if job.status == "paused" else None,
    )


@dataclass(frozen=True)
class Control:
    """How one coordinator changes running jobs: one change at a time, each announced.

    Parameters
    ----------
    fleet : str
        The fleet id (as in the MQTT topics).
    publish : Publish or None
        The publisher; ``None``: no push (agents learn versions by polling REST).

    Attributes
    ----------
    lock : threading.Lock
        Held while a topology is re-planned, so two requests of this process never
        interleave their read-modify-write of one job (PostgreSQL also locks the job's
        row; SQLite has one writer).

    """

    fleet: str
    publish: Publish | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    _checked: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    _checked_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def departures_due(self, job_id: str, now: float, every_s: float) -> bool:
        """Whether ``job_id``'s departure rules are due at ``now`` (unix seconds).

        True at most once per ``every_s`` seconds per job in this process (always when
        ``every_s`` is 0, or when ``now`` went back); each True starts the next period.
        """
        with self._checked_lock:
            last = self._checked.get(job_id)
            if last is not None and 0 <= now - last < every_s:
                return False
            self._checked[job_id] = now
            return True

    def announce(self, job: Job) -> None:
        """Publish ``job``'s current version and status; a failure is only logged."""
        if self.publish is None or job.topology is None:
            return
        try:
            self.publish(control_topic(self.fleet), encode_control(control_message(job)))
        except Exception as exc:  # a broker hiccup must not fail the REST request
            log.warning("cannot publish job %s on the control topic: %s", job.id, exc)
