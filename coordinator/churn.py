"""Churn: devices join and leave running jobs; each change is a new topology version.

A change takes effect at a round boundary: ``from_round`` is the highest round any
participant reported plus 2 (at least 2), so every agent can fetch the new version (by
REST or the control topic, :mod:`coordinator.control`) before it starts that round.
:func:`replan` repairs the current graph locally — :func:`meshfl.topology.remove_node`
chains the departed device's former neighbours, :func:`meshfl.topology.add_node`
attaches a newcomer to the least-loaded devices — so it stays connected and the devices
that stay keep their neighbours; for ``one-peer-exponential`` the union graph is
:func:`meshfl.topology.exponential` of the new size.

Departures are detected without a background task, when a job is read or a device
reports (:func:`departures`): by silence (``depart_after_s``), by the evidence of every
neighbour's ``missing`` lists (a killed agent, whose Last Will its neighbours saw), or by
battery (:func:`battery_departure`). :func:`elastic_job` finds the job an idle device
may join.

**Re-admission.** A participant taken out for silence or on its neighbours' evidence
(its agent was killed, or the device rebooted or lost its network) that asks for its
assignment again is taken back (:func:`may_rejoin`, ``replan(rejoin=...)``): its
participation is reopened — same ``index``, ``joined_round`` the new version's
``from_round``, ``left_round`` cleared — and a new version adds it back as a join with
reason :data:`REJOINED`. This holds whether or not the job is ``elastic``: a device that
rebooted is not a new member, and its agent resumes from its checkpoint. A device that
left for its battery, was drained or revoked, or said it stopped (posted done after it
was taken out, :data:`LEFT_ACKNOWLEDGED`) is never taken back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from coordinator import store
from coordinator.control import Control
from coordinator.db import Device, Job, JobDevice
from coordinator.planning import (
    DEFAULT_PLAN,
    battery_reasons,
    device_plans,
    edge_list,
    graph_for,
    graph_of,
    mixing,
    selects,
    uplinks,
    with_no_wait,
)
from coordinator.settings import CoordinatorSettings
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import JobSpec, TopologyEvent, TopologyEventKind, spec_value
from meshfl.topology import Graph, add_node, exponential, one_peer_exponential, remove_node

__all__ = [
    "LEFT_ACKNOWLEDGED",
    "MISSED_BY_ALL",
    "REJOINED",
    "battery_departure",
    "departures",
    "elastic_job",
    "may_rejoin",
    "next_from_round",
    "replan",
]

MISSED_BY_ALL = "missed by all neighbours (Last Will or silence)"
"""Reason recorded when a device leaves on its neighbours' evidence."""

SILENT = "silent for"
"""How the reasons of a departure by silence begin (``"silent for 61 s"``)."""

REJOINED = "rejoined"
"""Reason of the join event of a participant taken back after it was taken out."""

LEFT_ACKNOWLEDGED = "left_acknowledged"
"""Key set in a departed participant's ``final`` when its agent posted done afterwards:
it knows it left and stopped, so it is not taken back."""


def next_from_round(session: Session, job: Job) -> int:
    """The first round a change made now applies to: last reported round + 2, at least 2."""
    return max(2, store.last_round(session, job) + 2)


def _event(
    version: int, from_round: int, kind: TopologyEventKind, device: str, reason: str, at: float
) -> TopologyEvent:
    return TopologyEvent(
        version=version, from_round=from_round, kind=kind, device_id=device, reason=reason, at=at
    )


def _left(session: Session, job: Job, device_id: str, start: int, end: int, reason: str) -> str:
    """A departed participant's ``final["error"]``: from which round, and why."""
    if start < end:
        return f"left at round {start}: {reason}"[:500]
    latest = store.latest_reports(session, job, device_id, since_round=1, limit=1)
    last = f"round {latest[0].round}" if latest else "none"
    return f"left at the job's end (its last report: {last}): {reason}"[:500]


def _mean_degree(graph: Graph) -> int:
    return max(1, round(2 * len(graph.edges) / graph.n))


def replan(
    session: Session,
    job: Job,
    now: float,
    *,
    add: Sequence[Device] | None = None,
    remove: Mapping[str, str] | None = None,
    rejoin: Sequence[Device] | None = None,
    control: Control | None = None,
) -> list[JobDevice]:
    """Remove and add devices of a running job; each device changed is one new version.

    Parameters
    ----------
    session : Session
        The request's session; committed here.
    job : Job
        A running or paused job (anything else is left unchanged); a paused job only
        loses devices (an operator drained or revoked them).
    now : float
        Unix seconds, the events' ``at``.
    add : sequence of Device, optional
        Devices that join: each gets a new participation with the next free index,
        ``joined_round = from_round`` and, with ``spec.plan``, its planned
        :class:`~meshfl.contract.DevicePlan`. A device already taking part is skipped.
    remove : mapping of device id to reason, optional
        Participants that leave: ``left_round = from_round`` and, unless already done,
        ``done`` with ``final = {"error": "left at round R: <reason>"}``. A change found
        after the job's last round applies from ``rounds + 1`` ("left at the job's end",
        naming the device's last reported round). A device not in
        the current version is skipped. When the last device leaves, the job stops.
    rejoin : sequence of Device, optional
        Former participants taken back (see :func:`may_rejoin`, checked by the caller):
        each participation is reopened — ``index`` kept, ``joined_round = from_round``,
        ``left_round``, ``done`` and ``final`` cleared — and the device is added as a
        join (reason :data:`REJOINED`). A device still in the current version, or with
        no participation that left, is skipped.
    control : Control, optional
        Serialises changes and announces the new version (:meth:`Control.announce`).

    Returns
    -------
    list of JobDevice
        The participations created for ``add`` and reopened for ``rejoin``.

    """
    control = control or Control(fleet="")
    with control.lock:
        session.flush()
        session.refresh(job, with_for_update=True)  # another request may have changed it
        if job.status not in store.ACTIVE_STATUSES or job.topology is None:
            return []
        before = int(job.topology.get("version", 1))
        added = _apply(session, job, now, list(add or ()), dict(remove or {}), list(rejoin or ()))
        session.commit()
    if int((job.topology or {}).get("version", 1)) != before:
        control.announce(job)
    return added


def _apply(
    session: Session,
    job: Job,
    now: float,
    add: list[Device],
    remove: dict[str, str],
    rejoin: list[Device],
) -> list[JobDevice]:
    spec: JobSpec = job.spec  # type: ignore[assignment]
    topo: dict[str, Any] = dict(job.topology or {})
    rows = {r.device_id: r for r in store.participants(session, job, fresh=True)}
    devices: list[str] = list(topo["devices"])
    graph, version = graph_of(topo), int(topo.get("version", 1))
    events: list[TopologyEvent] = list(topo.get("events", []))
    plans = dict(topo.get("plan", {}))
    one_peer = topo["kind"] == "one-peer-exponential"
    end = int(spec["rounds"]) + 1  # a change found after the last round applies "after it"
    start = min(next_from_round(session, job), end)
    for device_id, reason in remove.items():
        row = rows.get(device_id)
        if row is None or row.left_round is not None or device_id not in devices:
            continue
        row.left_round = start
        if not row.done:
            why = _left(session, job, device_id, start, end, reason)
            row.done, row.final = True, {"error": why}
        version += 1
        events.append(_event(version, start, "leave", device_id, reason, now))
        if len(devices) == 1:  # never an empty graph: the job stops with its last device
            job.status, job.finished_at = "stopped", now
            break  # the graph keeps that device, for the record
        position = devices.index(device_id)
        devices.pop(position)
        graph = exponential(len(devices)) if one_peer else remove_node(graph, position)[0]
    added: list[JobDevice] = []
    joining = [(d, False) for d in add] + [(d, True) for d in rejoin]
    for device, back in joining if job.status == "running" else ():
        row = rows.get(device.id)
        if device.id in devices or not _may_open(row, back):
            continue
        members = store.get_devices(session, devices)
        if one_peer:
            graph = exponential(len(devices) + 1)
        else:
            graph = add_node(graph, _mean_degree(graph), uplinks(members))
        devices.append(device.id)
        plans[device.id] = device_plans(spec, [*members, device]).get(device.id, DEFAULT_PLAN)
        if row is None:
            row = JobDevice(
                job_id=job.id,
                device_id=device.id,
                index=max((r.index for r in rows.values()), default=-1) + 1,
                done=False,
                final=None,
                last_activity=now,
                joined_round=start,
            )
            session.add(row)
        else:  # reopened: the same index, so the same data shuffles
            row.done, row.final, row.left_round = False, None, None
            row.joined_round, row.last_activity = start, now
        rows[device.id], version = row, version + 1
        added.append(row)
        events.append(
            _event(version, start, "join", device.id, REJOINED if back else "joined", now)
        )
    if version == int(topo.get("version", 1)):
        return added
    members = store.get_devices(session, devices)
    graph = graph_for(spec, graph, members)
    plans = with_no_wait(spec, plans, graph, members)
    _, gap = mixing(graph, spec)
    topo.pop("W", None)  # stored by releases before W was derived from the edges
    topo.update(
        devices=devices,
        edges=edge_list(graph),
        gap=gap,
        version=version,
        from_round=start,
        events=events,
        plan=plans,
    )
    job.topology = topo  # a new dict: SQLAlchemy sees the JSON change
    return added


def departures(
    session: Session, job: Job, now: float, settings: CoordinatorSettings
) -> dict[str, str]:
    """The participants of a running job that have left, ``{device_id: reason}``.

    A participant that is neither done nor left leaves

    - by silence: nothing heard from it (no report, no assignment poll) for more than
      ``settings.depart_after_s`` seconds while another participant sent a round report
      within it (reason ``"silent for 61 s"``): the job goes on without it;
    - by evidence: each of its current neighbours (at least one; a neighbour done, left,
      or silent and itself missed by another neighbour bears no witness) listed it as
      ``missing`` in each of its latest 2 reports of the current version's rounds (for
      ``one-peer-exponential``: the latest 2 rounds in which they were paired), and it
      has been silent for more than ``settings.depart_evidence_s`` seconds and twice its
      latest reported ``round_s`` (so a slow but live device is not mistaken for a dead
      one) — reason :data:`MISSED_BY_ALL`;
    - by silence at the end: every other participant is done and it has been silent for
      more than ``settings.depart_at_end_s`` (a running agent asks for its assignment
      every 0.5 s): the job completes instead of waiting out ``depart_after_s``.
    """
    topo = job.topology
    if job.status != "running" or topo is None:
        return {}
    rows = store.participants(session, job)
    active = [r for r in rows if not r.done and r.left_round is None]
    leaving: dict[str, str] = {}
    reported: dict[str, float] | None = None  # read only when someone is long silent
    evidence = _Evidence(session, job, topo, rows, now, settings.depart_evidence_s)
    for row in active:
        silent = now - row.last_activity
        if silent > settings.depart_after_s:
            reported = store.last_report_at(session, job) if reported is None else reported
            if any(
                device_id != row.device_id and now - at <= settings.depart_after_s
                for device_id, at in reported.items()
            ):
                leaving[row.device_id] = f"silent for {silent:.0f} s"
                continue
        if silent > settings.depart_evidence_s and evidence.missed_by_all(row):
            leaving[row.device_id] = MISSED_BY_ALL
        elif silent > settings.depart_at_end_s and all(
            r.done for r in rows if r.device_id != row.device_id
        ):  # nobody is left to miss it: a running agent polls every 0.5 s, this one stopped
            leaving[row.device_id] = f"silent for {silent:.0f} s after the others finished"
    return leaving


class _Evidence:
    """Who missed whom in a job's latest rounds: departure by evidence (:func:`departures`)."""

    def __init__(
        self,
        session: Session,
        job: Job,
        topo: dict[str, Any],
        rows: list[JobDevice],
        now: float,
        wait_s: float,
    ) -> None:
        self.session, self.job, self.now, self.wait_s = session, job, now, wait_s
        self.devices: list[str] = topo["devices"]
        self.n = len(self.devices)
        self.graph = graph_of(topo)
        self.one_peer = topo["kind"] == "one-peer-exponential"
        self.since = int(topo.get("from_round", 1))
        self.heard_at = {
            r.device_id: r.last_activity for r in rows if not r.done and r.left_round is None
        }  # a participant done or left is absent: it bears no witness
        self._reports: dict[int, list[Any]] = {}  # device position → its latest reports

    def missed_by_all(self, row: JobDevice) -> bool:
        """Each witness among ``row``'s neighbours (at least one) missed it twice.

        A neighbour that is itself silent beyond ``wait_s`` and missed twice by another of
        its neighbours is dead too and bears no witness: two adjacent dead devices are each
        judged by their live neighbours.
        """
        if row.device_id not in self.devices:
            return False
        position = self.devices.index(row.device_id)
        own = store.latest_reports(self.session, self.job, row.device_id, since_round=1, limit=1)
        round_s = float(own[0].metrics.get("round_s", 0.0)) if own else 0.0
        if self.now - row.last_activity <= max(self.wait_s, 2 * round_s):
            return False
        witnesses = [j for j in self.graph.neighbours(position) if self._witness(j, position)]
        return bool(witnesses) and all(self._missed_twice(position, by=j) for j in witnesses)

    def _witness(self, j: int, of: int) -> bool:
        last = self.heard_at.get(self.devices[j])
        if last is None:
            return False
        if self.now - last <= self.wait_s:
            return True
        return not any(self._missed_twice(j, by=k) for k in self.graph.neighbours(j) if k != of)

    def _missed_twice(self, target: int, *, by: int) -> bool:
        """Device ``by`` listed device ``target`` as missing in its latest 2 rounds with it."""
        if by not in self._reports:  # one query per device and departure check
            limit = 2 * max(1, (self.n - 1).bit_length()) + 2 if self.one_peer else 2
            self._reports[by] = store.latest_reports(
                self.session, self.job, self.devices[by], since_round=self.since, limit=limit
            )
        reports = self._reports[by]
        if self.one_peer:  # only the rounds in which ``by`` was paired with ``target``
            reports = [
                m for m in reports if target in one_peer_exponential(self.n, m.round).neighbours(by)
            ]
        latest = reports[:2]
        return len(latest) == 2 and all(
            self.devices[target] in m.metrics["missing"] for m in latest
        )


def battery_departure(job: Job, row: JobDevice, device: Device) -> str | None:
    """Why ``device`` must leave ``job`` to save its battery, or ``None``.

    Only for a running job whose spec sets ``min_battery_percent`` > 0, and a participant
    neither done nor left whose latest profile is below it and not charging.
    """
    threshold = float(spec_value(job.spec, "min_battery_percent"))
    if job.status != "running" or threshold <= 0 or row.done or row.left_round is not None:
        return None
    return battery_reasons([device], threshold).get(device.id)


def elastic_job(session: Session, device: Device) -> Job | None:
    """The running job an idle ``device`` may join now, latest started first, or ``None``.

    The job's spec sets ``elastic``; the device never took part in it and matches the
    job's ``select`` (:func:`coordinator.planning.selects`); the change would apply from a
    round within ``spec.rounds``; and the device is not low on battery by the job's
    ``min_battery_percent``.
    """
    for job in store.running_jobs(session):
        spec = job.spec
        if not spec.get("elastic") or job.topology is None:
            continue
        if session.get(JobDevice, (job.id, device.id)) is not None:
            continue
        if not selects(spec.get("select", {}), device):
            continue
        if next_from_round(session, job) > int(spec["rounds"]):
            continue
        if battery_reasons([device], float(spec_value(spec, "min_battery_percent"))):
            continue
        return job
    return None


def may_rejoin(session: Session, job: Job, row: JobDevice, device: Device) -> bool:
    """Whether ``device``, taken out of ``job`` while it was silent, may be taken back now.

    All of: the job is running; ``row`` (the device's participation) left and its agent
    did not post done since (:data:`LEFT_ACKNOWLEDGED`); the device is ``active`` (not
    draining or revoked); its latest departure was for silence or on its neighbours'
    evidence (:func:`departures`), not for its battery nor by an operator; the change
    would apply from a round within ``spec.rounds``; it is not low on battery by the
    job's ``min_battery_percent``; the job is not a secure-aggregation one (a restarted
    device lost its per-job keys, ``docs/privacy.md``, "Limits").
    """
    spec = job.spec
    topo = job.topology
    if job.status != "running" or topo is None or row.left_round is None:
        return False
    if device.state != "active" or (row.final or {}).get(LEFT_ACKNOWLEDGED):
        return False
    if device.id in topo["devices"] or not _left_for_silence(topo, device.id):
        return False
    if PrivacyOptions.from_spec(spec).secure:
        return False
    if next_from_round(session, job) > int(spec["rounds"]):
        return False
    return not battery_reasons([device], float(spec_value(spec, "min_battery_percent")))


def _left_for_silence(topo: Mapping[str, Any], device_id: str) -> bool:
    """Whether the device's latest leave event was for silence or on evidence."""
    leaves = [
        e for e in topo.get("events", []) if e["kind"] == "leave" and e["device_id"] == device_id
    ]
    if not leaves:
        return False
    reason = str(leaves[-1]["reason"])
    return reason == MISSED_BY_ALL or reason.startswith(SILENT)


def _may_open(row: JobDevice | None, back: bool) -> bool:
    """A join needs no participation yet; a rejoin one that left."""
    return row is None if not back else row is not None and row.left_round is not None
