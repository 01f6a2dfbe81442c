"""Locust users of the W5 heartbeat benchmark: one user per enrolled device.

Run by ``benchmarks/w5_coordinator.py`` (not on its own); it passes, through the
environment:

- ``W5_DEVICES``: a file of ``device_id token`` lines, one per device;
- ``W5_RATE``: heartbeats a second per device (``constant_throughput``), each device's
  first one at a random moment (uniform, seeded) of its first period, so that the
  devices beat at independent phases: a steady total rate, not bursts;
- ``W5_WARMUP_S``, ``W5_SECONDS``: once every user is spawned, ``W5_WARMUP_S`` seconds
  pass, then requests sent in the next ``W5_SECONDS`` seconds are recorded; locust
  quits 2 s later (the last answers arrive);
- ``W5_RESULTS``: where ``{"window": [start, end], "samples": [[sent_at, latency_ms,
  ok], ...]}`` is written as JSON when locust quits; a request sent in the window and
  still unanswered then is a sample too: not ok, its latency the time it had waited
  (a lower bound), so a stalled server cannot hide its slowest requests;
- ``W5_KEEPALIVE``: ``1`` keeps each device's connection open between heartbeats,
  ``0`` (default) sends ``Connection: close`` so each heartbeat opens a new connection,
  as a device that reports every few seconds would.

Each request's latency is locust's own measurement (from sending the request to the
end of the response). Every response other than 204 is an error.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
from locust import constant_throughput, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.env import Environment

_DEVICES = [
    tuple(line.split())
    for line in Path(os.environ["W5_DEVICES"]).read_text().splitlines()
    if line.strip()
]
_NEXT = itertools.count()
_WARMUP_S = float(os.environ.get("W5_WARMUP_S", "5"))
_SECONDS = float(os.environ.get("W5_SECONDS", "60"))
_KEEPALIVE = os.environ.get("W5_KEEPALIVE", "0") == "1"
_RATE = float(os.environ.get("W5_RATE", "0.1"))  # heartbeats a second per device
_PHASES = random.Random(0)  # each device's first heartbeat: uniform over one period
_WINDOW = [float("inf"), float("inf")]  # [start, end) unix s, set once users are spawned
_SAMPLES: list[tuple[float, float, int]] = []  # (sent at, latency ms, ok)
_ENV: list[Environment] = []
_IN_FLIGHT: dict[int, float] = {}  # user -> when its unanswered request was sent


@events.init.add_listener
def _keep(environment: Environment, **_: Any) -> None:
    _ENV.append(environment)


@events.spawning_complete.add_listener
def _open_window(**_: Any) -> None:
    _WINDOW[0] = time.time() + _WARMUP_S
    _WINDOW[1] = _WINDOW[0] + _SECONDS
    runner = _ENV[0].runner
    if runner is not None:
        gevent.spawn_later(_WARMUP_S + _SECONDS + 2.0, runner.quit)


@events.request.add_listener
def _record(response_time: float, exception: BaseException | None, response: Any, **_: Any) -> None:
    sent = time.time() - response_time / 1000
    if _WINDOW[0] <= sent < _WINDOW[1]:
        ok = exception is None and response is not None and response.status_code == 204
        _SAMPLES.append((sent, float(response_time), int(ok)))


@events.quitting.add_listener
def _dump(**_: Any) -> None:
    now = time.time()
    unanswered = [
        (sent, 1000 * (now - sent), 0)
        for sent in _IN_FLIGHT.values()
        if _WINDOW[0] <= sent < _WINDOW[1]
    ]
    body = {"window": _WINDOW, "samples": _SAMPLES + unanswered}
    Path(os.environ["W5_RESULTS"]).write_text(json.dumps(body))


class Device(FastHttpUser):
    """One enrolled device sending heartbeats with its own token."""

    wait_time = constant_throughput(_RATE)

    def on_start(self) -> None:
        """Take the next device of the list: its heartbeat path and its token."""
        device_id, token = _DEVICES[next(_NEXT) % len(_DEVICES)]
        self.path = f"/api/v1/devices/{device_id}/heartbeat"
        self.headers = {"Authorization": f"Bearer {token}"}
        if not _KEEPALIVE:
            self.headers["Connection"] = "close"
        # A random phase in the heartbeat period: locust starts a whole second's batch
        # of users at once, and constant_throughput keeps each user's phase, so without
        # this the devices would beat in bursts (1,000 within a few ms every 10 s)
        # instead of at a steady 1,000/s.
        gevent.sleep(_PHASES.uniform(0.0, 1.0 / _RATE))

    @task
    def heartbeat(self) -> None:
        """Send one heartbeat; anything but 204 is a failure."""
        _IN_FLIGHT[id(self)] = time.time()
        with self.client.post(
            self.path, headers=self.headers, name="heartbeat", catch_response=True
        ) as response:
            if response.status_code != 204:
                response.failure(f"status {response.status_code}")
        del _IN_FLIGHT[id(self)]  # not in a finally: a user stopped mid-request stays
