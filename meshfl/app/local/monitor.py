"""Follow a local run's job to its end: settled rounds, churn, topology changes, failures."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshfl.app.local.admin import AdminClient
from meshfl.app.local.fleet import Churn
from meshfl.app.local.processes import Child, Supervisor
from meshfl.contract import JobPublic, RoundSummary
from meshfl.errors import CoordinatorError, CoordinatorUnreachable, MeshflError

if TYPE_CHECKING:
    from meshfl.app.local.config import LocalConfig
    from meshfl.app.local.lab.process_faults import ProcessFaults

__all__ = ["Hooks", "RoundHook", "agents", "check_servers", "monitor"]

JOB_POLL_S = 1.0
"""Seconds between reads of the followed job (its rounds are read every 0.3 s)."""

RoundHook = Callable[[RoundSummary, Supervisor], None]


@dataclass
class Hooks:
    """What :func:`monitor` tells its caller (see :func:`meshfl.app.local.run.run_local`)."""

    on_round: RoundHook | None
    show: Callable[[list[RoundSummary]], None] | None
    notify: Callable[[str], None] | None

    def say(self, line: str) -> None:
        """Pass one line to ``notify``, if any."""
        if self.notify is not None:
            self.notify(line)


def agents(supervisor: Supervisor) -> list[Child]:
    """The agent children (``device-*``, and ``fleet-*`` of in-process agents), in start order."""
    return [c for c in supervisor.children if c.name.startswith(("device-", "fleet-"))]


def check_servers(supervisor: Supervisor, stopped: Collection[str] = ()) -> None:
    """MeshflError when the broker or the coordinator has exited (not one in ``stopped``)."""
    for child in supervisor.children:
        if child.name in stopped:
            continue
        if child.name in ("broker", "coordinator") and child.returncode is not None:
            raise MeshflError(f"the {child.name} exited unexpectedly ({child.describe_exit()})")


def monitor(
    admin: AdminClient,
    supervisor: Supervisor,
    job: JobPublic,
    config: LocalConfig,
    hooks: Hooks,
    churn: Churn,
    faults: ProcessFaults | None = None,
) -> tuple[JobPublic, list[RoundSummary], dict[str, str]]:
    """Follow the job to its end: settled rounds to the hooks, churn, failed agents.

    ``faults`` strikes the run's process faults (``--chaos broker=...``) at each poll;
    the processes it stopped are not failures, and the coordinator is not polled while
    it is down (nor blamed for refusing connections just after its restart). A read that
    times out while the coordinator process runs (an overloaded coordinator: hundreds of
    in-process agents) is retried until no round has finished for the stall limit.
    """
    job_id = job["job_id"]
    seen, version, latest = 0, 0, 0
    settled: list[RoundSummary] = []  # final: only the rounds after them are read again
    job_read_at = -JOB_POLL_S
    failed: dict[str, str] = {}
    slow = False  # the last read timed out while the coordinator ran
    last_progress = time.monotonic()
    stall_s = 4 * config.round_deadline_s + 60.0
    churn.start()
    if faults is not None:
        faults.start()
    while True:
        stopped: Collection[str] = ()
        if faults is not None:
            for line in faults.tick(latest):
                hooks.say(line)
            faults.check()
            stopped = faults.down
        check_servers(supervisor, stopped)
        if "coordinator" in stopped:
            time.sleep(0.1)
            continue
        try:
            rounds = [*settled, *admin.rounds(job_id, since=_next_round(settled))]
            latest = max((r["round"] for r in rounds), default=0)
            if _job_due(job_read_at, latest, job, supervisor):
                job, job_read_at = admin.job(job_id), time.monotonic()
        except CoordinatorUnreachable as exc:
            recovering = faults is not None and faults.coordinator_recovering()
            if not recovering and time.monotonic() - last_progress > stall_s:
                raise
            if not recovering and not slow:  # alive (check_servers) but too busy to answer
                hooks.say(f"the coordinator is slow to answer ({exc}); still following the job")
            slow = not recovering
            time.sleep(0.3)
            continue
        slow = False
        children = agents(supervisor)
        settled = _settled(rounds, job, children)
        if len(settled) > seen:
            for k in range(seen, len(settled)):
                if hooks.show is not None:  # the round first, then what happened after it
                    hooks.show(settled[: k + 1])
                for line in churn.on_round(settled[k]["round"], supervisor):
                    hooks.say(line)
                if hooks.on_round is not None:
                    hooks.on_round(settled[k], supervisor)
            seen = len(settled)
            last_progress = time.monotonic()
            version = _say_topology_changes(admin, job, version, hooks)
        for child in children:
            code = child.returncode
            expected = child.name in churn.killed or child.name in stopped  # on purpose
            if code not in (None, 0) and child.name not in failed and not expected:
                failed[child.name] = child.describe_exit()
        if job["status"] != "running" or all(
            c.returncode is not None and c.name not in stopped for c in children
        ):
            if job["status"] == "running":
                job = _stop(admin, job_id)
            rounds = admin.rounds(job_id)  # all of them, as they are now
            if hooks.show is not None and len(rounds) > seen:
                hooks.show(rounds)
            return job, rounds, failed
        if time.monotonic() - last_progress > stall_s:
            raise MeshflError(
                f"no round finished for {stall_s:.0f} s; see the logs in {supervisor.log_dir}"
            )
        time.sleep(0.3)


def _job_due(read_at: float, latest: int, job: JobPublic, supervisor: Supervisor) -> bool:
    """Whether to read the job again: every :data:`JOB_POLL_S`, and at each poll near its end.

    Near its end means its last round was reported or an agent exited. Otherwise a job's
    status and devices change seldom, and reading the job costs the coordinator every
    round report of the job.
    """
    return (
        time.monotonic() - read_at >= JOB_POLL_S
        or latest >= int(job["spec"]["rounds"])
        or any(c.returncode is not None for c in agents(supervisor))
    )


def _stop(admin: AdminClient, job_id: str) -> JobPublic:
    """Stop a job whose agents have all exited; the job as it ended if it already had.

    The monitor's last read of the job can be up to :data:`JOB_POLL_S` old, so the job
    may have completed since (the coordinator then refuses the stop with 409).
    """
    try:
        return admin.stop_job(job_id)
    except CoordinatorError as exc:
        if exc.status != 409:
            raise
        return admin.job(job_id)


def _next_round(settled: list[RoundSummary]) -> int:
    return settled[-1]["round"] + 1 if settled else 1


def _settled(rounds: list[RoundSummary], job: JobPublic, agents: list[Child]) -> list[RoundSummary]:
    """The leading rounds that every device expected to report them has reported.

    A round shown before its last report arrives would understate its bytes and
    misstate its accuracy. Expected for round r: the job's devices that take part in r
    (``joined_round <= r``, and r before ``left_round``) whose agent has not failed and
    whose report of r the coordinator does not already count missing (a joiner that caught
    up past its first round never reports it).
    """
    failed = {c.name for c in agents if c.returncode not in (None, 0)}
    spans = [
        (d.get("joined_round", 1), d.get("left_round"), set(d.get("missing_rounds", [])))
        for d in job["devices"]
        if d["name"] not in failed
    ]
    settled = []
    for r in rounds:
        n = r["round"]
        expected = sum(  # a round the coordinator already counts missing is not awaited
            1
            for joined, left, missing in spans
            if joined <= n and (left is None or n < left) and n not in missing
        )
        if r["devices_reporting"] < expected:
            break
        settled.append(r)
    return settled


def _say_topology_changes(admin: AdminClient, job: JobPublic, seen: int, hooks: Hooks) -> int:
    """Tell the operator about topology versions newer than ``seen``; return the newest."""
    if hooks.notify is None:
        return seen
    topology = admin.topology(job["job_id"])
    names = {d["device_id"]: d["name"] for d in job["devices"]}
    for event in topology.get("events", []):
        if event["version"] <= seen:
            continue
        device = names.get(event["device_id"] or "", event["device_id"])
        what = f"{device} {event['kind']}s" if device else topology["kind"]
        hooks.say(
            f"topology v{event['version']} from round {event['from_round']}: {what}"
            f" ({event['reason']})"
        )
    gap = topology["spectral_gap"]
    version = int(topology.get("version", 1))
    if version > seen:
        count = len(topology["devices"])
        hooks.say(f"topology v{version}: {count} devices, spectral gap {gap:.4f}")
    return version
