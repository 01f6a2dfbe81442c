"""The agent's Prometheus metrics (edge_agent.telemetry) and its JSON log lines.

Fake rounds drive :class:`AgentTelemetry` directly; its HTTP endpoint is scraped and
parsed with prometheus-client's parser; two real JobRunners over the in-memory bus
(a DP job, a fake coordinator) feed it and log JSON lines naming device and job.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_agent_models import DEVICES, JOB, _assignment, _config, _connected, _digits_files
from test_agent_privacy import BudgetClient

from edge_agent.inbox import EngineStats
from edge_agent.job import JobRunner
from edge_agent.observer import RoundSample, engine_counts
from edge_agent.secagg.inbox import SecureStats
from edge_agent.telemetry import AgentTelemetry
from edge_agent.transport.memory import MemoryBroker
from meshfl.app.cli import main
from meshfl.app.cli.logs import log_handler
from meshfl.errors import ConfigError
from meshfl.modelspec import from_options, with_hash

_LINK = {"broker_rtt_s": 0.001, "uplink_bytes_per_s": 1e9, "downlink_bytes_per_s": 1e9}


def sample(rnd: int, **counts: object) -> RoundSample:
    fields: dict[str, object] = {"seconds": 0.3, "bytes_sent": 100, "bytes_received": 250}
    fields.update(counts)
    return RoundSample(job="job-1", round=rnd, **fields)  # type: ignore[arg-type]


def value(t: AgentTelemetry, name: str, **labels: str) -> float | None:
    return t.registry.get_sample_value(name, {"device": "dev-1", **labels})


def test_fake_rounds_update_the_counters_by_what_the_engine_gained() -> None:
    t = AgentTelemetry("pi-1")
    t.connected("dev-1", lambda: 3, lambda: 2)
    t.job_started("job-1", lambda: 5)
    t.round_finished(sample(1, applied=2, dropped={"duplicate": 1}, rejected={"unsigned": 4},
                            epsilon=0.5))  # fmt: skip
    t.round_finished(sample(2, seconds=1.5, applied=7, dropped={"duplicate": 1, "stale": 2},
                            rejected={"unsigned": 6}, epsilon=0.9))  # fmt: skip

    job = {"job": "job-1"}
    assert value(t, "meshfl_agent_rounds_total", **job) == 2
    assert value(t, "meshfl_agent_round_seconds_count", **job) == 2
    assert value(t, "meshfl_agent_round_seconds_sum", **job) == pytest.approx(1.8)
    assert value(t, "meshfl_agent_round_seconds_bucket", **job, le="1.0") == 1
    assert value(t, "meshfl_agent_bytes_sent_total", **job) == 200
    assert value(t, "meshfl_agent_bytes_received_total", **job) == 500
    assert value(t, "meshfl_agent_deltas_applied_total", **job) == 7  # cumulative, not 2 + 7
    assert value(t, "meshfl_agent_deltas_dropped_total", **job, reason="duplicate") == 1
    assert value(t, "meshfl_agent_deltas_dropped_total", **job, reason="stale") == 2
    assert value(t, "meshfl_agent_deltas_rejected_total", **job, reason="unsigned") == 6
    assert value(t, "meshfl_agent_epsilon_spent", **job) == 0.9
    assert value(t, "meshfl_agent_reconnects_total") == 3
    assert value(t, "meshfl_agent_callback_errors_total") == 2
    assert value(t, "meshfl_agent_queue_depth") == 5
    t.job_finished("job-1")
    assert value(t, "meshfl_agent_queue_depth") == 0


def test_engine_counts_read_the_gossip_and_the_secure_engine() -> None:
    gossip = EngineStats(applied=9, duplicates=2, stale=1, rejected=3, bad_signature=4)
    secure = SecureStats(committed=5, late_ignored=2, replayed=1)

    applied, dropped, rejected = engine_counts(gossip)
    s_applied, s_dropped, s_rejected = engine_counts(secure)

    assert applied == 9 and dropped["duplicate"] == 2 and dropped["stale"] == 1
    assert rejected == {"malformed": 3, "unsigned": 0, "signature": 4, "replayed": 0}
    assert s_applied == 5 and s_dropped["late"] == 2 and s_dropped["duplicate"] == 0
    assert s_rejected["replayed"] == 1


@pytest.fixture
def served() -> Iterator[tuple[AgentTelemetry, int]]:
    t = AgentTelemetry()
    port = t.serve("127.0.0.1", 0)
    yield t, port
    t.close()


def test_the_http_endpoint_serves_metrics_prometheus_can_parse(
    served: tuple[AgentTelemetry, int],
) -> None:
    t, port = served
    t.connected("dev-1", lambda: 1)
    t.round_finished(sample(1, applied=4))

    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    families = {f.name: f for f in text_string_to_metric_families(reply.text)}

    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    wanted = {"meshfl_agent_rounds", "meshfl_agent_round_seconds", "meshfl_agent_bytes_sent",
              "meshfl_agent_bytes_received", "meshfl_agent_deltas_applied",
              "meshfl_agent_deltas_dropped", "meshfl_agent_deltas_rejected",
              "meshfl_agent_reconnects", "meshfl_agent_queue_depth",
              "meshfl_agent_epsilon_spent"}  # fmt: skip
    assert wanted <= set(families)
    applied = families["meshfl_agent_deltas_applied"].samples[0]
    assert applied.labels == {"device": "dev-1", "job": "job-1"} and applied.value == 4
    assert families["meshfl_agent_round_seconds"].type == "histogram"


def test_a_metrics_port_in_use_is_a_one_line_config_error(
    served: tuple[AgentTelemetry, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, port = served

    with pytest.raises(ConfigError, match=f"127.0.0.1:{port} .*choose another --metrics-port"):
        AgentTelemetry().serve("127.0.0.1", port)
    with pytest.raises(SystemExit) as exit_:
        main(["agent", "run", "--coordinator", "http://127.0.0.1:9", "--token", "t",
              "--data", str(tmp_path / "x.npz"), "--metrics-port", str(port)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert exit_.value.code != 0 and len(err.splitlines()) == 1
    assert err.startswith("meshfl: error: cannot serve metrics on 127.0.0.1:")


def test_a_dp_job_feeds_the_metrics_and_logs_json_lines_naming_device_and_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = with_hash(from_options("mlp", 64, 10))
    files = _digits_files(tmp_path)
    bus = MemoryBroker()
    clients = [BudgetClient(limit=100) for _ in DEVICES]  # grants every release: ε 1.0
    telemetry = [AgentTelemetry(name) for name in DEVICES]
    lines = io.StringIO()
    handler = log_handler("json", stream=lines)
    caplog.set_level(logging.INFO, logger="meshfl.agent")
    logging.getLogger("meshfl.agent").addHandler(handler)
    errors: list[BaseException] = []

    def device(i: int) -> None:
        assignment = _assignment(model, i)
        assignment["spec"].update(rounds=2, codec="identity", dp_noise_multiplier=1.0,
                                  dp_clip=1.0, round_deadline_s=10.0)  # fmt: skip
        clients[i].current = assignment  # what the reporter's polls read: still running
        try:
            transport = _connected(bus, DEVICES[i])
            telemetry[i].connected(DEVICES[i], lambda: transport.reconnects)
            runner = JobRunner(
                _config(tmp_path, files[i], DEVICES[i]),
                clients[i],  # type: ignore[arg-type]
                transport,
                DEVICES[i],
                assignment,  # type: ignore[arg-type]
                {**_LINK, "measured_at": time.time()},  # type: ignore[arg-type]
                observer=telemetry[i],
            )
            with np.load(files[i]) as data:
                runner.run(data["x"], data["y"])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(DEVICES))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        logging.getLogger("meshfl.agent").removeHandler(handler)

    assert errors == []
    for i, name in enumerate(DEVICES):
        t, labels = telemetry[i], {"device": name, "job": JOB}
        get = t.registry.get_sample_value
        assert get("meshfl_agent_rounds_total", labels) == 2
        sent = sum(m["bytes_sent"] for m in clients[i].metrics)
        assert get("meshfl_agent_bytes_sent_total", labels) == sent > 0
        assert get("meshfl_agent_deltas_applied_total", labels) == 2  # one per round
        assert get("meshfl_agent_epsilon_spent", labels) == 1.0
        assert get("meshfl_agent_queue_depth", {"device": name}) == 0  # the job ended
    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    rounds = [r for r in records if r["message"].startswith("round 1: accuracy")]
    assert sorted(r["device"] for r in rounds) == DEVICES
    for r in rounds:
        assert r["job"] == JOB and r["level"] == "INFO" and r["logger"] == "meshfl.agent.job"
        assert r["timestamp"].endswith("+00:00")
    assert all(set(r) >= {"timestamp", "level", "logger", "message", "device", "job"}
               for r in records)  # fmt: skip


def test_json_lines_outside_a_context_carry_null_and_bad_formats_are_refused() -> None:
    lines = io.StringIO()
    logger = logging.getLogger("meshfl.test.logs")
    logger.addHandler(handler := log_handler("json", stream=lines))
    logger.propagate = False
    try:
        logger.warning("no device yet")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True

    record = json.loads(lines.getvalue())
    assert record["device"] is None and record["job"] is None
    assert record["message"] == "no device yet" and record["level"] == "WARNING"
    with pytest.raises(ConfigError, match="--log-format must be text or json"):
        log_handler("yaml")
