"""``meshfl local``: a whole fleet on this machine, end to end.

Starts the embedded broker (unless a broker URL is given), a coordinator on a free port
and N agent *processes* — the same ``meshfl agent run`` a device runs — partitions the
dataset into per-device files, runs one job, and writes ``DIR/report.json`` and
``DIR/report.png``. Everything it started is stopped on success, on Ctrl-C and on
failure; a failure names the part that failed. With ``secure`` the broker is a Mosquitto
with TLS, a login per device and the fleet's ACL (:mod:`meshfl.app.local.secure_broker`).
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.app.local.admin import AdminClient
from meshfl.app.local.bridged import brokers_section, check_bridged_options, start_bridged
from meshfl.app.local.config import LocalConfig
from meshfl.app.local.dashboard import linger, start_dashboard
from meshfl.app.local.fleet import Churn, device_name, start_links
from meshfl.app.local.inprocess import check_in_process_options, coordinator_tuning, start_fleets
from meshfl.app.local.jobspec import check_codec_policy, job_spec, prepare_data
from meshfl.app.local.lab.chaos import ChaosFleet
from meshfl.app.local.lab.process_faults import ProcessFaults, broker_faults
from meshfl.app.local.lab.shaping import ShapingProxy
from meshfl.app.local.monitor import Hooks, RoundHook, agents, check_servers, monitor
from meshfl.app.local.onnx_report import report_section
from meshfl.app.local.pooled import start_pooled_reference
from meshfl.app.local.processes import (
    Child,
    Supervisor,
    free_port,
    uninterrupted,
    wait_for_port,
)
from meshfl.app.local.report import (
    add_unmixed,
    build_report,
    ledger_section,
    unmixed_by_device,
    write_report,
)
from meshfl.app.local.secure_broker import (
    SECURITY_LINE,
    SecureBroker,
    check_secure_options,
    rejection_totals,
    start_secure_broker,
)
from meshfl.app.local.validation import validate
from meshfl.app.local.zygote import Zygote, zygote_enabled
from meshfl.contract import JobPublic, JobSpec, RoundSummary
from meshfl.errors import ConfigError, Interrupted, MeshflError
from meshfl.files import writable_dir

if TYPE_CHECKING:
    from broker.bridge import BridgedBrokers
    from broker.mosquitto import MosquittoProcess

__all__ = ["LocalConfig", "LocalRun", "preflight", "run_local", "validate"]


@dataclass
class LocalRun:
    """What a local run produced: the report (as written to ``report.json``) and paths."""

    report: dict[str, Any]
    report_path: Path
    plot_path: Path | None
    failed_agents: dict[str, str] = field(default_factory=dict)


def preflight(config: LocalConfig) -> Path:
    """Every check of ``config`` that needs no process: options, dataset name, ``--out``.

    Creates ``config.out`` if needed and returns it. Raises
    :class:`~meshfl.errors.ConfigError` naming the option; :func:`run_local` calls it
    first, and the CLI before its banner so that a refusal is the only line printed.
    """
    from models.builtin import check_dataset

    validate(config)
    check_secure_options(config)
    check_bridged_options(config)
    check_in_process_options(config)
    check_dataset(config.dataset)
    return writable_dir(config.out)


def run_local(
    config: LocalConfig,
    on_round: RoundHook | None = None,
    show: Callable[[list[RoundSummary]], None] | None = None,
    notify: Callable[[str], None] | None = None,
    on_report: Callable[[LocalRun], None] | None = None,
    on_enrolled: Callable[[], None] | None = None,
) -> LocalRun:
    """Run one job on a local fleet and return its report.

    Parameters
    ----------
    config
        The run's options.
    on_round
        Called once per new round summary with the supervisor (tests use it to kill an
        agent mid-run).
    show
        Called with all round summaries whenever a new one arrives (the live table).
    notify
        Called with one line per fleet event: an agent joining or killed
        (``join_at``/``kill``), a new topology version, the dashboard's login link.
    on_report
        Called once ``report.json`` is written, while the broker and the coordinator
        still run (before the ``dashboard_linger_s`` wait); not on failure or Ctrl-C.
    on_enrolled
        Called once every agent has enrolled and reported its profile (its link probed
        through the broker), just before the job is created: start-up traffic ends there.

    Raises
    ------
    meshfl.errors.ConfigError
        Bad options or data.
    meshfl.errors.MeshflError
        A part of the fleet failed; the message names it.

    """
    out = preflight(config)
    # The agents' zygote imports torch while the data is cut and the servers start.
    zygote = Zygote(out / "logs") if zygote_enabled() else None
    try:
        device_files, test_file = prepare_data(config)
        spec = job_spec(config, test_file)
        check_codec_policy(spec)
    except BaseException:
        if zygote is not None:
            zygote.stop()
        raise
    supervisor = Supervisor(out / "logs", zygote=zygote)
    started = time.monotonic()
    hooks = Hooks(on_round, show, notify)
    say = notify or (lambda line: None)
    admin: AdminClient | None = None
    proxies: dict[str, ShapingProxy] = {}
    chaos: ChaosFleet | None = None
    secure: SecureBroker | None = None
    mosquitto: MosquittoProcess | None = None  # the run's own, for --chaos broker=...
    bridged: BridgedBrokers | None = None  # --brokers N > 1
    try:
        if config.brokers > 1:
            bridged = start_bridged(out, config.brokers)
            broker_url = bridged.url_for(0)
        elif config.secure:
            secure = start_secure_broker(out)
            broker_url = secure.url
            say(SECURITY_LINE)
        elif config.broker is None and broker_faults(config.chaos):
            mosquitto = _start_mosquitto(out)
            broker_url = mosquitto.url
        else:
            broker_url = config.broker or _start_broker(supervisor)
        proxies = start_links(config, broker_url)
        if config.chaos:
            chaos = ChaosFleet.start(config, broker_url, proxies)
            hooks.on_round = chaos.wrap(hooks.on_round, say)
        enrol_token = secrets.token_urlsafe(16)
        url, admin = _start_coordinator(
            supervisor, out, broker_url, enrol_token,
            [*([] if secure is None else secure.coordinator_args()),
             "--log-format", config.log_format],
            **coordinator_tuning(config), ca_file=None if secure is None else secure.ca_file,
        )  # fmt: skip
        pin = [] if secure is None else ["--coordinator-ca", str(secure.ca_file)]  # HTTPS
        say(f"broker {broker_url}, coordinator {url}; starting {config.agents} agents")
        dashboard = start_dashboard(admin, config.open_browser, say) if config.dashboard else None
        slow = {device_name(name, "--slow"): factor for name, factor in config.slow}

        def start_agent(name: str) -> Child:
            proxy = proxies.get(name)
            port = None if proxy is None else proxy.port
            if chaos is not None and name in chaos.proxies:  # in front of the shaping proxy
                port = chaos.port(name)
            broker = [] if port is None else ["--broker", f"mqtt://127.0.0.1:{port}"]
            if bridged is not None:  # no proxies then: device-i on broker i mod N
                broker = ["--broker", bridged.url_for(int(name.split("-")[1]))]
            slowdown = [] if name not in slow else ["--slowdown", repr(slow[name])]
            if config.step_time_s > 0:
                slowdown += ["--step-time", repr(config.step_time_s)]
            return supervisor.start(
                name,
                [
                    "agent", "run", "--coordinator", url,
                    "--data", str(device_files[int(name.split("-")[1])]), "--name", name,
                    "--out", str(out / "models"), "--once",
                    "--label-column", config.label_column, *broker, *slowdown,
                    "--log-format", config.log_format, *pin,
                    # the factory the user passed meshfl local is the user's own code
                    *(["--allow-model", config.model] if ":" in config.model else []),
                ],
                env={"MESHFL_TOKEN": enrol_token},  # not in ps: only its user reads environ
            )  # fmt: skip

        if config.in_process:
            start_fleets(supervisor, config, url, enrol_token, device_files, extra=pin)
        for i in range(0 if config.in_process else config.agents):
            start_agent(f"device-{i}")
        _wait_for_enrolment(admin, supervisor, config.agents, secure)
        if on_enrolled is not None:
            on_enrolled()
        job = admin.create_job(spec)
        job = admin.start_job(job["job_id"])
        say(f"{config.agents} agents enrolled; job {job['job_id']} started")
        churn = Churn(config, start_agent)
        if chaos is not None and chaos.spec.processes:
            chaos.processes = ProcessFaults(
                chaos.spec.processes,
                supervisor,
                mosquitto,
                lambda: _coordinator_up(supervisor, url),
            )
        faults = None if chaos is None else chaos.processes
        try:
            final_job, rounds, failed = monitor(
                admin, supervisor, job, config, hooks, churn, faults
            )
        except KeyboardInterrupt:
            raise _interrupted(
                config, admin, job, started, churn, proxies, dashboard, chaos
            ) from None
        except MeshflError:
            if secure is not None:
                secure.check()  # a dead broker is the cause: say so
            raise
        declined = [d for d in final_job["devices"] if d["error"]]
        if not rounds and declined:
            raise MeshflError(
                f"no round completed: {declined[0]['name']} declined the job"
                f" ({declined[0]['error']})"
            )
        if not rounds and failed:
            name, why = next(iter(failed.items()))
            raise MeshflError(f"no round completed: agent {name} failed ({why})")
        report = build_report(
            config, final_job, rounds, time.monotonic() - started, failed,
            topology=admin.topology(job["job_id"]), churn=churn.events, links=proxies,
            profiles={d["device_id"]: d["profile"] for d in admin.devices()},
            device_reports=admin.reports(job["job_id"]), dashboard_url=dashboard,
        )  # fmt: skip
        report["security"] = _security_section(admin, final_job, spec, secure)
        report["chaos"] = None if chaos is None else chaos.report()
        report["ledger"] = _ledger(admin, job["job_id"])
        unmixed = _unmixed(admin, final_job)
        report["ledger"]["unmixed"] = None if unmixed is None else _total(unmixed)
        if unmixed is not None:
            add_unmixed(report, unmixed)
        if bridged is not None:
            report["brokers"] = brokers_section(bridged, config.agents + len(config.join_at))
        say("job ended; fetching the consensus model and checking the ONNX exports")
        pooled = start_pooled_reference(spec, device_files, test_file, supervisor.zygote, out)
        report["artifacts"] = _artifacts(admin, job["job_id"], out / "consensus.onnx")
        published = report["artifacts"].get("path")
        report["onnx"] = report_section(
            final_job, spec, test_file, out, failed, None if published is None else Path(published),
            supervisor.zygote,
            private=None if spec["publish_model"] else PRIVATE_CONSENSUS,  # no un-noised model
        )  # fmt: skip
        report["final"]["pooled_reference"] = pooled()
        report_path, plot_path = write_report(out, report)
        result = LocalRun(report, report_path, plot_path, failed)
        if on_report is not None:
            on_report(result)
        if dashboard is not None:
            linger(config.dashboard_linger_s, dashboard, supervisor, say)
    finally:
        with uninterrupted():  # a Ctrl-C now would leave servers running
            if admin is not None:
                admin.close()
            supervisor.stop_all()
            for proxy in proxies.values():
                proxy.stop()
            if chaos is not None:
                chaos.stop()
            if secure is not None:
                secure.stop()
            if mosquitto is not None:
                mosquitto.stop()
            if bridged is not None:
                bridged.stop()
    return result


PRIVATE_CONSENSUS = (
    "not built: in a private job (DP or secure aggregation) the devices' un-noised final"
    " models stay on the devices; each device's own model is in its --out folder"
)
"""Why a private local run has no consensus model (the report's ``onnx.consensus.error``)."""


def _security_section(
    admin: AdminClient, job: JobPublic, spec: JobSpec, secure: SecureBroker | None
) -> dict[str, Any]:
    """The report's ``security`` section: what was on, and the refused envelopes summed."""
    section: dict[str, Any] = {
        "secure": secure is not None,
        "broker": "mosquitto" if secure is not None else None,
        "tls": secure is not None,
        "broker_logins": secure is not None,
        "acl": secure is not None,
        "signed_deltas": bool(spec.get("signed_deltas", True)),
        "broker_dir": None if secure is None else str(secure.directory),
    }
    devices = [d["device_id"] for d in job["devices"]]
    try:
        section["rejected"] = rejection_totals(admin, job["job_id"], devices)
    except MeshflError as exc:  # never lose the run's report over this
        section["rejected"] = {"error": str(exc)}
    return section


def _ledger(admin: AdminClient, job_id: str) -> dict[str, Any]:
    """The report's ``ledger`` section, or ``{"error": why}`` (the report is never lost)."""
    try:
        return ledger_section(admin.ledger(job_id))
    except MeshflError as exc:
        return {"error": str(exc)}


def _unmixed(admin: AdminClient, job: JobPublic) -> dict[str, dict[int, int]] | None:
    """Neighbours left out of a round's mixing, per device left out and round.

    ``RoundMetrics.missing`` of every report (:func:`unmixed_by_device`); None if the
    coordinator could not be read. Losses the ledger cannot see show here: a neighbour's
    message that never came before the round went on without it.
    """
    try:
        metrics = {
            d["device_id"]: admin.device_metrics(job["job_id"], d["device_id"])
            for d in job["devices"]
        }
    except MeshflError:
        return None
    return unmixed_by_device(metrics)


def _total(unmixed: dict[str, dict[int, int]]) -> int:
    return sum(sum(rounds.values()) for rounds in unmixed.values())


def _artifacts(admin: AdminClient, job_id: str, path: Path) -> dict[str, Any]:
    """The coordinator's model artifacts; its consensus model saved as ``path``.

    Returns the ``GET /jobs/{id}/artifacts`` listing plus the saved ``path``, or
    ``{"error": why}``: a failure here never loses the run's report.
    """
    try:
        listing: dict[str, Any] = dict(admin.artifacts(job_id))
        consensus = listing.get("consensus")
        if consensus is not None and consensus["sha256"] is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(admin.download(f"/jobs/{job_id}/artifacts/consensus.onnx"))
            listing["path"] = str(path)
        return listing
    except (MeshflError, OSError) as exc:
        return {"error": str(exc)}


def _interrupted(
    config: LocalConfig,
    admin: AdminClient,
    job: JobPublic,
    started: float,
    churn: Churn,
    proxies: dict[str, ShapingProxy],
    dashboard: str | None,
    chaos: ChaosFleet | None = None,
) -> Interrupted:
    """Stop the job, write the partial report, and say so (the caller stops the processes).

    ``dashboard`` is the dashboard's URL without its token (``None``: no ``--dashboard``);
    ``chaos`` the run's fault proxies (``None``: no ``--chaos``). The partial report has
    the same ``chaos`` and ``ledger`` sections as a finished one, as far as they got.
    """
    try:
        final_job = admin.stop_job(job["job_id"])
        rounds = admin.rounds(job["job_id"])
        topology = admin.topology(job["job_id"])
    except MeshflError:
        return Interrupted("interrupted; every process of the run was stopped")
    report = build_report(
        config, final_job, rounds, time.monotonic() - started, {},
        topology=topology, churn=churn.events, links=proxies, dashboard_url=dashboard,
    )  # fmt: skip
    report["status"] = "interrupted"
    report["chaos"] = None if chaos is None else chaos.report()
    report["ledger"] = _ledger(admin, job["job_id"])
    path, _ = write_report(config.out, report)
    return Interrupted(
        f"interrupted after round {len(rounds)}; every process of the run was stopped;"
        f" partial report in {path}"
    )


def _start_broker(supervisor: Supervisor) -> str:
    port = free_port()
    child = supervisor.start("broker", ["broker", "serve", "--port", str(port)])
    try:
        wait_for_port("127.0.0.1", port, 30.0, alive=child)
    except MeshflError as exc:
        raise MeshflError(f"the embedded broker failed to start: {exc}") from None
    return f"mqtt://127.0.0.1:{port}"


def _start_mosquitto(out: Path) -> MosquittoProcess:
    """Start the run's own Mosquitto in ``out/broker`` (anonymous, loopback, persistence)."""
    from broker.mosquitto import MosquittoProcess

    workdir = (out / "broker").resolve()
    if workdir.exists():  # a previous run's sessions must not come back
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    process = MosquittoProcess(workdir=workdir, start_timeout_s=30.0)
    try:
        process.start()
    except ConfigError:
        raise
    except MeshflError as exc:
        raise MeshflError(f"the Mosquitto broker failed to start: {exc}") from None
    return process


def _coordinator_up(supervisor: Supervisor, url: str) -> None:
    """Wait until the restarted coordinator at ``url`` listens again."""
    child = supervisor.child("coordinator")
    port = int(url.rsplit(":", 1)[1])
    wait_for_port("127.0.0.1", port, 60.0, alive=child)


def _start_coordinator(
    supervisor: Supervisor,
    out: Path,
    broker_url: str,
    enrol_token: str,
    extra: list[str],
    env: dict[str, str] | None = None,
    admin_timeout_s: float = 10.0,
    ca_file: Path | None = None,
) -> tuple[str, AdminClient]:
    admin_token = secrets.token_urlsafe(16)
    port = free_port()
    db = out / "coordinator.db"
    db.unlink(missing_ok=True)
    child = supervisor.start(
        "coordinator",
        [
            "coordinator", "serve", "--port", str(port), "--db", f"sqlite:///{db}",
            "--broker-url", broker_url, *extra,
        ],
        env={
            # One user on loopback: agents enrol all at once and the monitor polls per device.
            **{f"MESHFL_COORDINATOR_RATE_LIMIT_{who}": "" for who in ("ENROL", "OPERATOR")},
            # Secrets in the environment, never on a command line that ps shows to everyone.
            "MESHFL_COORDINATOR_ENROL_TOKEN": enrol_token,
            "MESHFL_COORDINATOR_ADMIN_TOKEN": admin_token,
            **(env or {}),
        },
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, 60.0, alive=child)
    except MeshflError as exc:
        raise MeshflError(f"the coordinator failed to start: {exc}") from None
    url = f"{'http' if ca_file is None else 'https'}://127.0.0.1:{port}"  # ca_file: TLS
    return url, AdminClient(url, admin_token, timeout_s=admin_timeout_s, ca_file=ca_file)


def _wait_for_enrolment(
    admin: AdminClient, supervisor: Supervisor, n: int, secure: SecureBroker | None
) -> None:
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        check_servers(supervisor)
        if secure is not None:
            secure.check()
        for child in agents(supervisor):
            if child.returncode is not None:
                raise MeshflError(f"agent {child.name} failed at start-up: {child.last_line()}")
        # Ready: enrolled and reported its measured profile (the planner's input).
        if sum("train_samples_per_s" in d["profile"] for d in admin.devices()) >= n:
            return
        time.sleep(0.2)
    raise MeshflError(f"only {len(admin.devices())} of {n} agents enrolled within 120 s")
