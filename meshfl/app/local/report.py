"""Build and write a local run's ``report.json`` and its plot ``report.png``."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.contract import DeviceRoundReport, JobLedger, JobPublic, RoundSummary

if TYPE_CHECKING:
    from meshfl.app.local.config import LocalConfig
    from meshfl.app.local.lab.shaping import ShapingProxy

__all__ = [
    "TARGETS",
    "add_unmixed",
    "build_report",
    "ledger_line",
    "ledger_section",
    "live_time_to_accuracy",
    "unmixed_by_device",
    "write_report",
]

_MEASURED = ("train_samples_per_s", "broker_rtt_s", "uplink_bytes_per_s", "downlink_bytes_per_s")

TARGETS = (0.80, 0.85, 0.90)
"""Mean test accuracies whose first round, elapsed seconds and bytes the report gives."""


def build_report(
    config: LocalConfig,
    job: JobPublic,
    rounds: list[RoundSummary],
    wall_s: float,
    failed: Mapping[str, str],
    *,
    topology: Mapping[str, Any] | None = None,
    churn: Sequence[Mapping[str, Any]] = (),
    links: Mapping[str, ShapingProxy] | None = None,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    device_reports: Sequence[DeviceRoundReport] = (),
    dashboard_url: str | None = None,
) -> dict[str, Any]:
    """The ``report.json`` document of a local run.

    Parameters
    ----------
    config, job, rounds, wall_s, failed
        The options, the job at the end, its round summaries, the run's wall-clock
        seconds, and ``{agent name: why}`` for agents that failed.
    topology : mapping, optional
        The job's topology at the end (``GET /jobs/{id}/topology``); reported without
        the mixing matrix, device ids replaced by names.
    churn : sequence of dict
        ``{"event": "join" | "kill", "device", "round", "at_s"}`` (see
        :class:`meshfl.app.local.fleet.Churn`).
    device_reports : sequence of DeviceRoundReport
        Every device's round reports (``GET /jobs/{id}/reports``), for
        ``time_to_accuracy_live``: the first moment the mean of the devices' latest
        accuracies reached each target — rounds need not align (async, slow links); and
        ``device_rounds``: each report as ``{"device" (name), "round", "accuracy",
        "bytes_sent", "elapsed_s"}``, in arrival order (``meshfl export tensorboard``).
    links : mapping of str to ShapingProxy, optional
        The shaped links by device name: their spec and the bytes they carried.
    profiles : mapping of str to CapabilityProfile, optional
        The latest capability profile by device id; each device's entry gets its
        measured ``train_samples_per_s``, ``broker_rtt_s``, ``uplink_bytes_per_s`` and
        ``downlink_bytes_per_s`` (None where unmeasured).
    dashboard_url : str, optional
        The web dashboard's URL, never its token (``None``: no ``--dashboard``); every
        report, an interrupted run's too, has the key.

    """
    names = {d["device_id"]: d["name"] for d in job["devices"]}
    devices = [
        {
            "id": d["device_id"],
            "name": d["name"],
            "index": d["index"],
            "final_accuracy": d["final_accuracy"],
            "bytes_sent": d["bytes_sent"],
            "bytes_received": d["bytes_received"],
            "missing_rounds": d["missing_rounds"],
            "isolated_rounds": d["isolated_rounds"],
            "joined_round": d.get("joined_round", 1),
            "left_round": d.get("left_round"),
            "failed": failed.get(d["name"]) or d["error"],
            "epsilon_spent": d.get("epsilon_spent"),  # this job's ε (None: no DP)
            "profile": {k: (profiles or {}).get(d["device_id"], {}).get(k) for k in _MEASURED},
        }
        for d in job["devices"]
    ]
    last = rounds[-1] if rounds else None
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    return {
        "config": cfg,
        "job_id": job["job_id"],
        "status": job["status"],
        "rounds": [
            {
                "round": r["round"],
                "mean_accuracy": r["mean_accuracy"],
                "min_accuracy": r["min_accuracy"],
                "consensus_distance": r["consensus_distance"],
                "bytes_sent": r["bytes_sent"],
                "bytes_received": r["bytes_received"],
                "elapsed_s": r["elapsed_s"],
                "devices_reporting": r["devices_reporting"],
                "missing_devices": [names.get(i, i) for i in r["missing_devices"]],
            }
            for r in rounds
        ],
        "devices": devices,
        "privacy": privacy_summary(job),
        "final": {
            "mean_accuracy": last["mean_accuracy"] if last else None,
            "min_accuracy": last["min_accuracy"] if last else None,
            "rounds_completed": len(rounds),
            "bytes_sent_total": sum(r["bytes_sent"] for r in rounds),
            "bytes_received_total": sum(r["bytes_received"] for r in rounds),
            "wall_s": wall_s,
        },
        "time_to_accuracy": _time_to_accuracy(rounds),
        "time_to_accuracy_live": live_time_to_accuracy(device_reports),
        "device_rounds": [_device_round(r, names) for r in device_reports],
        "topology": None if topology is None else topology_summary(topology, names),
        "churn": [dict(event) for event in churn],
        "links": [
            {"device": name, "link": spec, "bytes_up": p.bytes_up, "bytes_down": p.bytes_down}
            for name, spec, p in _links(config, links or {})
        ],
        "dashboard_url": dashboard_url,
    }


_LEDGER_ROUND = ("round", "devices_reporting", "sent", "delivered", "applied", "duplicates",
                 "rejected", "missing", "awaiting_keyframe", "delivered_late",
                 "recovered_by_keyframe", "lost", "unrepaired", "applied_twice",
                 "retransmitted")  # fmt: skip


def ledger_section(ledger: JobLedger) -> dict[str, Any]:
    """The report's ``ledger`` section: the run's totals and each round's totals.

    ``ledger`` is ``GET /jobs/{id}/ledger``'s answer; its per-device rows stay at the
    coordinator. docs/reliability.md defines the fields.
    """
    section: dict[str, Any] = {
        "totals": dict(ledger["totals"]),
        "rounds": [{k: dict(r)[k] for k in _LEDGER_ROUND} for r in ledger["rounds"]],
    }
    if "derived" in ledger:  # per (sender, receiver): what became of every message
        section["derived"] = dict(ledger["derived"])
    return section


def unmixed_by_device(
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, dict[int, int]]:
    """Which devices' deltas their neighbours did not mix, and in which rounds.

    ``metrics`` maps each device id to its round reports (``RoundMetrics``: ``round`` and
    ``missing``, the neighbours it mixed without). Returns device id → {round: how many
    neighbours mixed without it that round}; the sum over devices is the ledger's
    ``unmixed``.
    """
    out: dict[str, dict[int, int]] = {}
    for reports in metrics.values():
        for m in reports:
            for sender in m.get("missing", ()):
                rounds = out.setdefault(str(sender), {})
                rounds[int(m["round"])] = rounds.get(int(m["round"]), 0) + 1
    return out


def add_unmixed(report: dict[str, Any], unmixed: Mapping[str, Mapping[int, int]]) -> None:
    """Give each device of ``report`` its ``unmixed`` count and ``unmixed_rounds``.

    ``unmixed``: (neighbour, round) pairs in which a neighbour mixed without this
    device's delta (too late for the round deadline, lost, or never sent);
    ``unmixed_rounds``: the rounds with at least one.
    """
    for device in report["devices"]:
        rounds = unmixed.get(device["id"], {})
        device["unmixed"] = sum(rounds.values())
        device["unmixed_rounds"] = sorted(rounds)


def ledger_line(section: dict[str, Any]) -> str:
    """The one-line summary ``meshfl local`` prints of a report's ``ledger`` section."""
    if "error" in section:
        return f"ledger: not available ({section['error']})"
    t = section["totals"]
    if not t["devices_reporting"]:
        return "ledger: no device reported one"
    return (
        f"ledger: {t['sent']} sent, {t['applied']} applied, {t['applied_twice']} applied"
        f" twice, {t['duplicates']} duplicates dropped, {t['rejected']} rejected,"
        f" {t.get('delivered_late', 0)} delivered late,"
        f" {t.get('retransmitted', 0)} re-sent on request,"
        f" {t['recovered_by_keyframe']} recovered by keyframe,"
        f" {t['unrecovered_losses']} lost"
        + (f", {section['unmixed']} not mixed" if section.get("unmixed") else "")
        + (
            f", {section['derived']['unaccounted']} unaccounted"
            if section.get("derived", {}).get("unaccounted")
            else ""
        )
    )


def _device_round(r: DeviceRoundReport, names: Mapping[str, str]) -> dict[str, Any]:
    """One device's round report as ``device_rounds`` shows it: the device by name."""
    return {"device": names.get(r["device_id"], r["device_id"]), "round": r["round"],
            "accuracy": r["accuracy"], "bytes_sent": r["bytes_sent"],
            "elapsed_s": r["elapsed_s"]}  # fmt: skip


def topology_summary(topology: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """The report's view of a ``TopologyPublic``: no mixing matrix, devices by name."""
    return {
        "kind": topology["kind"],
        "version": topology.get("version", 1),
        "from_round": topology.get("from_round", 1),
        "spectral_gap": topology["spectral_gap"],
        "devices": [names.get(d, d) for d in topology["devices"]],
        "edges": [list(edge) for edge in topology["edges"]],
        "events": [
            {**event, "device": names.get(event["device_id"] or "", event["device_id"])}
            for event in topology.get("events", [])
        ],
    }


def _links(
    config: LocalConfig, proxies: Mapping[str, ShapingProxy]
) -> list[tuple[str, str, ShapingProxy]]:
    from meshfl.app.local.fleet import device_name

    specs = {device_name(name, "--link"): spec for name, spec in config.links}
    return [(name, specs.get(name, ""), proxy) for name, proxy in proxies.items()]


def _time_to_accuracy(rounds: list[RoundSummary]) -> dict[str, dict[str, float] | None]:
    reached: dict[str, dict[str, float] | None] = {f"{t:.2f}": None for t in TARGETS}
    sent = 0
    for r in rounds:
        sent += r["bytes_sent"]
        for target in TARGETS:
            key = f"{target:.2f}"
            if reached[key] is None and r["mean_accuracy"] >= target:
                reached[key] = {"round": r["round"], "elapsed_s": r["elapsed_s"],
                                "bytes_sent": sent}  # fmt: skip
    return reached


def live_time_to_accuracy(
    reports: Sequence[DeviceRoundReport],
) -> dict[str, dict[str, float] | None]:
    """When the mean of every device's latest reported accuracy first reached each target.

    Reports are taken in arrival order; the mean counts from the moment every device
    that reports at all has reported once. ``{target: {"elapsed_s", "bytes_sent"}}``
    (seconds since the job started, payload bytes sent by then), ``None`` if never.
    """
    reached: dict[str, dict[str, float] | None] = {f"{t:.2f}": None for t in TARGETS}
    devices = {r["device_id"] for r in reports}
    latest: dict[str, float] = {}
    sent = 0
    for r in sorted(reports, key=lambda r: r["elapsed_s"]):
        latest[r["device_id"]] = r["accuracy"]
        sent += r["bytes_sent"]
        if len(latest) < len(devices):
            continue
        mean = sum(latest.values()) / len(latest)
        for target in TARGETS:
            key = f"{target:.2f}"
            if reached[key] is None and mean >= target:
                reached[key] = {"elapsed_s": r["elapsed_s"], "bytes_sent": sent}
    return reached


def write_report(out: Path, report: dict[str, Any]) -> tuple[Path, Path | None]:
    """Write ``out/report.json`` atomically and ``out/report.png`` (accuracy and bytes).

    Returns the two paths; the plot path is ``None`` when there is no round to plot.
    """
    path = out / "report.json"
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".report-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(report, handle, indent=2)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    rounds = report["rounds"]
    if not rounds:
        return path, None
    return path, _plot(out / "report.png", report)


def _plot(path: Path, report: dict[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = report["rounds"]
    x = [r["round"] for r in rounds]
    cumulative = []
    total = 0
    for r in rounds:
        total += r["bytes_sent"]
        cumulative.append(total / 1e6)
    cfg = report["config"]
    fig, (acc, sent) = plt.subplots(1, 2, figsize=(11, 4))
    acc.plot(x, [r["mean_accuracy"] for r in rounds], marker="o", ms=3, label="mean")
    acc.plot(x, [r["min_accuracy"] for r in rounds], marker=".", ms=3, label="minimum")
    pooled = (report["final"].get("pooled_reference") or {}).get("accuracy")
    if pooled is not None:
        acc.axhline(pooled, color="tab:green", linestyle="--", lw=1, label="pooled reference")
    acc.set_xlabel("round")
    acc.set_ylabel("test accuracy")
    acc.set_ylim(0, 1)
    acc.grid(alpha=0.3)
    acc.legend()
    sent.bar(x, [r["bytes_sent"] / 1e3 for r in rounds], color="tab:gray", label="this round")
    sent.set_xlabel("round")
    sent.set_ylabel("payload sent this round (kB)")
    twin = sent.twinx()
    twin.plot(x, cumulative, color="tab:red", label="total")
    twin.set_ylabel("total payload sent (MB)", color="tab:red")
    fig.suptitle(
        f"meshfl local: {cfg['algorithm']} {cfg['codec']} on {cfg['topology']},"
        f" {cfg['agents']} agents, {cfg['dataset']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def privacy_summary(job: JobPublic) -> dict[str, Any] | None:
    """The job's DP guarantee: ``{"unit", "epsilon", "delta"}`` (``None``: no DP).

    ``unit`` is ``device`` (a device's whole dataset) or ``record`` (one of its
    examples, DP-SGD); ``epsilon`` is the largest ε this job spent on a device (``None``
    before any spend), at the job's ``delta`` (docs/privacy.md).
    """
    spec: Mapping[str, Any] = job.get("spec") or {}
    if not spec.get("dp_noise_multiplier"):
        return None
    spent = [d["epsilon_spent"] for d in job["devices"] if d.get("epsilon_spent") is not None]
    return {
        "unit": spec.get("dp_unit", "device"),
        "epsilon": max(spent, default=None),  # type: ignore[type-var]
        "delta": spec.get("dp_delta", 1e-5),
    }
