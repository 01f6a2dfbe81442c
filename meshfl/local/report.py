"""Write a local run's ``report.json`` and its plot ``report.png``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_report"]


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
