"""``meshfl local``: the newcomer's first command and the benchmark harness."""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshfl.app.cli.logs import LogFormat, LogFormatOption
from meshfl.app.cli.model import (
    HiddenOption,
    ImageShapeOption,
    ModelKwargsOption,
    ModelOption,
    parse_hidden,
    parse_image_shape,
    parse_kwargs,
)
from meshfl.app.cli.options import privacy_defaults, with_job_options
from meshfl.app.local.config import DEFAULTS
from meshfl.contract import DEFAULT_MODEL, RoundSummary

if TYPE_CHECKING:
    from meshfl.app.local.run import LocalRun


@with_job_options
def local(
    job: dict[str, Any],
    agents: Annotated[int, typer.Option(help="Number of agent processes.")] = DEFAULTS.agents,
    dataset: Annotated[
        str,
        typer.Option(
            help="Built in (digits, mnist1d, iris, wine, breast_cancer), a .npz/.csv file or"
            " an image folder to partition."
        ),
    ] = DEFAULTS.dataset,
    alpha: Annotated[
        float, typer.Option(help="Dirichlet α of the label-skew partition.")
    ] = DEFAULTS.alpha,
    broker: Annotated[
        str | None, typer.Option(help="Use this broker (mqtt://HOST:PORT) instead of the embedded.")
    ] = None,
    brokers: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Run N Mosquitto brokers bridged on loopback (N >= 2): the coordinator on"
            " the first, agents alternating over all (docs/scaling.md).",
        ),
    ] = DEFAULTS.brokers,
    in_process: Annotated[
        int,
        typer.Option(
            metavar="K",
            help="Run the agents as threads of K processes (meshfl agent fleet) instead of"
            " one process each: hundreds of agents on one machine (docs/scaling.md).",
        ),
    ] = DEFAULTS.in_process,
    label_column: Annotated[
        str, typer.Option(help="Label column of a CSV dataset.")
    ] = DEFAULTS.label_column,
    seed: Annotated[int, typer.Option(help="Seed of the partition and the model.")] = DEFAULTS.seed,
    model_seed: Annotated[
        int | None,
        typer.Option(help="Seed of the model and the shuffles only (default: --seed)."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Output directory.")] = DEFAULTS.out,
    slow: Annotated[
        list[str] | None,
        typer.Option(
            metavar="DEVICE:FACTOR",
            help="That agent trains FACTOR times slower (repeatable; e.g. 3:4).",
        ),
    ] = None,
    step_time: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="Emulate edge devices: every training step takes at least SECONDS (times"
            " its --slow factor), the agent sleeping the difference (W6: 0.05).",
        ),
    ] = 0.0,
    link: Annotated[
        list[str] | None,
        typer.Option(
            metavar="DEVICE:RATE",
            help="That agent reaches the broker over a shaped link, DEVICE:RATE[:LATENCY]"
            " (repeatable; 3:1mbit:200ms).",
        ),
    ] = None,
    join_at: Annotated[
        list[int] | None,
        typer.Option(metavar="ROUND", help="One more agent starts after ROUND (repeatable)."),
    ] = None,
    kill: Annotated[
        list[str] | None,
        typer.Option(
            metavar="DEVICE@ROUND", help="SIGKILL that agent after ROUND (repeatable; 2@8)."
        ),
    ] = None,
    chaos: Annotated[
        list[str] | None,
        typer.Option(
            metavar="SPEC",
            help="Inject faults (repeatable): between every agent and the broker, e.g."
            " drop=0.1,dup=0.1 (also reorder=, corrupt=, delay=MS, seed=) or"
            " partition=device-2@5:40; and process faults during a round, each restarted"
            " SECONDS later: broker=ROUND:term|kill[:SECONDS] (the run's own Mosquitto),"
            " coordinator=ROUND[:SECONDS], restart=DEVICE@ROUND[:SECONDS]"
            " (docs/reliability.md).",
        ),
    ] = None,
    model: ModelOption = DEFAULT_MODEL,
    model_kwargs: ModelKwargsOption = None,
    hidden: HiddenOption = None,
    image_shape: ImageShapeOption = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Run the fleet on its own Mosquitto with TLS, a broker login per device and"
            " the fleet's ACL; deltas signed (docs/security.md). Not with --broker or --link.",
        ),
    ] = False,
    dashboard: Annotated[
        bool,
        typer.Option(
            "--dashboard",
            help="Print a read-only login link to the coordinator's web dashboard (fleet,"
            " topology graph, training curves; docs/dashboard.md).",
        ),
    ] = False,
    dashboard_linger: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="With --dashboard: keep the broker and coordinator up this long after the"
            " job ends [default: until Ctrl-C on a terminal, else 0].",
            show_default=False,
        ),
    ] = None,
    open_browser: Annotated[
        bool, typer.Option("--open", help="With --dashboard: open the link in your browser.")
    ] = False,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run a whole fleet on this machine: broker, coordinator and agent processes."""
    # The job's options (``job``) are the table's: meshfl.contract.JOB_OPTIONS.
    from rich.console import Console

    from meshfl.app.local.fleet import parse_kill, parse_link_option, parse_slow
    from meshfl.app.local.run import LocalConfig, preflight, run_local
    from meshfl.app.local.validation import canonical_topology
    from meshfl.codecs import parse_codec
    from meshfl.errors import Interrupted

    secure_note = privacy_defaults(job)
    job["codec"] = parse_codec(job["codec"]).spec  # canonical form in the banner and the report
    if job["topology"] is not None:
        job["topology"] = canonical_topology(job["topology"])
    config = LocalConfig(
        **job,
        agents=agents,
        dataset=dataset,
        alpha=alpha,
        broker=broker,
        seed=seed,
        model_seed=model_seed,
        out=out,
        label_column=label_column,
        slow=tuple(parse_slow(s) for s in slow or ()),
        step_time_s=step_time,
        links=tuple(parse_link_option(s) for s in link or ()),
        join_at=tuple(join_at or ()),
        kill=tuple(parse_kill(s) for s in kill or ()),
        chaos=",".join(chaos or ()),
        model=model,
        hidden=_tuple(parse_hidden(hidden)),
        image_shape=_tuple(parse_image_shape(image_shape)),
        model_kwargs=parse_kwargs(model_kwargs),
        secure=secure,
        dashboard=dashboard,
        dashboard_linger_s=_linger(dashboard, dashboard_linger),
        open_browser=open_browser,
        log_format=log_format.value,
        brokers=brokers,
        in_process=in_process,
    )
    preflight(config)  # before the banner: a refusal is the only line printed
    # SIGTERM and SIGHUP (a closed terminal; not under nohup) stop the run like Ctrl-C:
    # every child process is stopped, a partial report written.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _raise_interrupt)
    console = Console(soft_wrap=True)  # paths and lines stay whole when output is captured
    console.print(
        f"[bold]meshfl local[/]: {agents} agents, {config.algorithm} {config.codec},"
        f" {config.topology}, {config.rounds} rounds on {dataset} → {out}/",
        soft_wrap=True,
    )
    if secure_note:
        console.print(secure_note, highlight=False)
    view = _RoundView(console)
    began = time.monotonic()

    def summarize(result: LocalRun) -> None:  # before a --dashboard-linger wait
        view.close()
        _summary(console, result, time.monotonic() - began, config.dp_delta)

    try:
        with view:
            run_local(config, show=view.update, notify=view.note, on_report=summarize)
    except KeyboardInterrupt:
        raise Interrupted("interrupted; every process of the run was stopped") from None
    finally:
        view.close()


def _summary(console: Any, result: LocalRun, total_s: float, dp_delta: float) -> None:
    """Print the run's outcome: accuracy, bytes, churn, topology, privacy, report, ONNX."""
    final = result.report["final"]
    if final["mean_accuracy"] is None:
        console.print("[yellow]no round completed[/]")
    else:
        console.print(
            f"final mean accuracy [bold]{final['mean_accuracy']:.4f}[/],"
            f" minimum {final['min_accuracy']:.4f};"
            f" {final['bytes_sent_total'] / 1e6:.3f} MB sent;"
            f" {final['wall_s']:.1f} s from fleet start to the job's end,"
            f" {total_s:.1f} s in all"
        )
    pooled = final.get("pooled_reference") or {}
    if "accuracy" in pooled:
        console.print(
            f"pooled reference {pooled['accuracy']:.4f}: the same model trained centrally on all"
            f" {pooled['samples']:,} training samples for {pooled['epochs']} epochs (SGD,"
            f" learning rate {pooled['learning_rate']:g},"
            f" heavy-ball momentum {pooled['momentum']:g})"
        )
    if result.report.get("brokers") is not None:
        from meshfl.app.local.bridged import brokers_line

        console.print(brokers_line(result.report["brokers"]), markup=False, soft_wrap=True)
    for name, why in result.failed_agents.items():
        console.print(f"[yellow]agent {name} failed: {why}[/]")
    for line in _churn_lines(result.report):
        console.print(line)
    topo = result.report["topology"]
    if topo is not None:
        console.print(
            f"topology {topo['kind']} v{topo['version']}: {len(topo['devices'])} devices,"
            f" spectral gap {topo['spectral_gap']:.4f}"
        )
    killed = {e["device"] for e in result.report["churn"] if e["event"] == "kill"}
    missing = [
        d for d in result.report["devices"] if d["missing_rounds"] and d["name"] not in killed
    ]
    for d in missing:
        console.print(f"[yellow]{d['name']} missed rounds {_ranges(d['missing_rounds'])}[/]")
    if result.report.get("chaos"):
        from meshfl.app.local.lab.chaos import chaos_line

        console.print(
            chaos_line(result.report["chaos"]), markup=False, highlight=False, soft_wrap=True
        )
    ledger = result.report.get("ledger")
    if ledger is not None:
        from meshfl.app.local.report import ledger_line

        console.print(ledger_line(ledger), markup=False, highlight=False, soft_wrap=True)
    spent = [d["epsilon_spent"] for d in result.report["devices"] if d.get("epsilon_spent")]
    if spent:
        console.print(
            f"differential privacy: ε spent per device {min(spent):.3g}–{max(spent):.3g}"
            f" at δ = {dp_delta:g} (RDP accountant; docs/privacy.md)"
        )
    console.print(
        f"report: {result.report_path}"
        + (f", plot: {result.plot_path}" if result.plot_path else "")
    )
    onnx = result.report.get("onnx")
    if onnx is not None:
        from meshfl.app.local.onnx_report import consensus_line

        for failure in onnx["failures"]:
            console.print(f"ONNX check failed: {failure}", style="red", markup=False)
        console.print(consensus_line(onnx), markup=False, highlight=False, soft_wrap=True)


def _linger(dashboard: bool, seconds: float | None) -> float | None:
    """``--dashboard-linger`` as given, else with ``--dashboard`` on a terminal ``math.inf``.

    ``None`` (not given, no wait) otherwise: validate() refuses any given value without
    ``--dashboard``, 0 included.
    """
    if seconds is not None or not dashboard or not sys.stdin.isatty():
        return seconds
    return math.inf


def _tuple(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)


def _churn_lines(report: dict[str, Any]) -> list[str]:
    """What each --join-at / --kill really did, checked against the job's events."""
    devices = {d["name"]: d for d in report["devices"]}
    events = (report["topology"] or {}).get("events", [])
    lines = []
    for event in report["churn"]:
        name, round_ = event["device"], event["round"]
        if event["event"] == "join":
            joined = next((e for e in events if e["kind"] == "join" and e["device"] == name), None)
            lines.append(
                f"{name} started after round {round_} and joined from round {joined['from_round']}"
                if joined
                else f"[yellow]{name} started after round {round_} but was never admitted: the"
                " job ended before it asked for work (an agent takes seconds to start; use"
                " more --rounds)[/]"
            )
            continue
        device = devices.get(name, {})
        finished = device.get("left_round") is None and not device.get("missing_rounds")
        lines.append(
            f"[yellow]{name} was SIGKILLed after round {round_}, but it had already"
            " reported every round (agents run ahead of the coordinator's view)[/]"
            if finished
            else f"{name} was SIGKILLed after round {round_}"
        )
    return lines


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


class _RoundView:
    """A live per-round table on a terminal; one printed line per round otherwise."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.live: Any = None
        self.printed = 0

    def __enter__(self) -> _RoundView:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._table([]), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def note(self, line: str) -> None:
        """A fleet event (join, kill, new topology version), printed above the table."""
        self.console.print(f"[cyan]{line}[/]", highlight=False, soft_wrap=True)

    def update(self, rounds: list[RoundSummary]) -> None:
        if self.live is not None:
            self.live.update(self._table(rounds))
            return
        if self.printed == 0:
            self.console.print(" ".join(f"{h:>{w}}" for h, w in zip(_HEADER, _WIDTHS, strict=True)))
        for r in rounds[self.printed :]:
            self.console.print(" ".join(_cells(r, _total(rounds, r["round"]))), highlight=False)
        self.printed = len(rounds)

    def _table(self, rounds: list[RoundSummary]) -> Any:
        from rich.table import Table

        table = Table(title="rounds", header_style="bold")
        for name in (
            "round",
            "mean acc",
            "min acc",
            "consensus dist",
            "sent kB",
            "total MB",
            "elapsed s",
        ):
            table.add_column(name, justify="right")
        for r in rounds[-40:]:
            table.add_row(*_cells(r, _total(rounds, r["round"])))
        return table


def _total(rounds: list[RoundSummary], upto: int) -> int:
    return sum(r["bytes_sent"] for r in rounds if r["round"] <= upto)


_HEADER = ("round", "mean acc", "min acc", "consensus", "sent kB", "total MB", "elapsed s")
_WIDTHS = (5, 8, 8, 10, 9, 9, 9)


def _cells(r: RoundSummary, total: int) -> list[str]:
    cd = r["consensus_distance"]
    values = [
        str(r["round"]),
        f"{r['mean_accuracy']:.4f}",
        f"{r['min_accuracy']:.4f}",
        "-" if cd is None else f"{cd:.3e}",
        f"{r['bytes_sent'] / 1e3:.1f}",
        f"{total / 1e6:.3f}",
        f"{r['elapsed_s']:.1f}",
    ]
    return [f"{v:>{w}}" for v, w in zip(values, _WIDTHS, strict=True)]


def _ranges(values: list[int]) -> str:
    return ", ".join(str(v) for v in values) if len(values) < 6 else f"{values[0]}–{values[-1]}"
