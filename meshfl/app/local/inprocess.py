"""``meshfl local --in-process K``: the fleet's agents as threads of K processes.

Instead of one ``meshfl agent run`` process per agent, K ``meshfl agent fleet`` processes
(children ``fleet-0`` ... ``fleet-{K-1}``) each run a contiguous block of the agents,
``device-0`` ... first: 256 agents in 2 processes are ``device-0..127`` and
``device-128..255``. Every agent is still a device of its own (identity, enrolment, MQTT
session); they share each process's torch (:mod:`edge_agent.fleet`). A process that ends
with an error is reported as the failure of ``fleet-k``, naming its failed agents.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.app.local.processes import Child, Supervisor
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.app.local.config import LocalConfig

__all__ = [
    "MAX_IN_PROCESS_AGENTS",
    "blocks",
    "check_in_process_options",
    "coordinator_tuning",
    "start_fleets",
]

MAX_IN_PROCESS_AGENTS = 1024
"""Most agents ``meshfl local --in-process`` starts (the limit of :mod:`edge_agent.fleet`
is per process; this one bounds the coordinator's and the broker's load on one machine)."""

DEPART_EVIDENCE_S = 30.0
"""The local coordinator's ``depart_evidence_s`` (seconds) for in-process agents."""
ADMIN_TIMEOUT_S = 60.0
"""How long (seconds) the launcher waits for one coordinator answer with in-process agents."""

POLL_S = 1.0
"""Assignment polling period (seconds) of in-process agents (``meshfl agent run``: 0.5):
N agents send the coordinator N polls a second, and each poll counts as the agent's
activity for the coordinator's departure rules (:func:`coordinator_tuning`)."""


def check_in_process_options(config: LocalConfig) -> None:
    """Refuse options that need one process per agent.

    Raises
    ------
    meshfl.errors.ConfigError
        ``in_process`` negative or above ``agents``, or combined with ``--slow``,
        ``--step-time``,
        ``--link``, ``--join-at``, ``--kill``, ``--chaos``, ``--secure`` or ``--brokers``.

    """
    k = config.in_process
    if k == 0:
        return
    if not 1 <= k <= config.agents:
        raise ConfigError(f"--in-process must be between 1 and --agents (got {k})")
    conflicts = {
        "--slow": bool(config.slow),
        "--step-time": config.step_time_s > 0,
        "--link": bool(config.links),
        "--join-at": bool(config.join_at),
        "--kill": bool(config.kill),
        "--chaos": bool(config.chaos),
        "--secure": config.secure,
        "--brokers": config.brokers > 1,
    }
    for option, given in conflicts.items():
        if given:
            raise ConfigError(
                f"--in-process runs agents as threads and does not combine with {option}"
                " (it acts on one agent's process or link); drop one of them"
            )


def coordinator_tuning(config: LocalConfig) -> dict[str, Any]:
    """Keyword arguments for the launcher's coordinator start: none with one process an agent.

    In-process fleets of hundreds of agents load the local coordinator (one process,
    SQLite) so that an answer can take over 10 s on a 2-core machine: the launcher waits
    up to 60 s (``admin_timeout_s``). ``depart_evidence_s`` goes from 1.5 to 30 s: the
    coordinator checks every participant silent longer than that against its neighbours'
    reports (five SQL queries each) on every assignment poll and round report, and the
    threads of a busy fleet process poll late; at 256 agents, with 1.5 s and with 10 s,
    each request cost O(N) queries and the coordinator fell behind for good
    (docs/scaling.md, In-process agents). A dead in-process agent still leaves by
    silence (``depart_after_s``, 60 s).
    """
    if not config.in_process:
        return {}
    return {
        "env": {"MESHFL_COORDINATOR_DEPART_EVIDENCE_S": str(DEPART_EVIDENCE_S)},
        "admin_timeout_s": ADMIN_TIMEOUT_S,
    }


def blocks(agents: int, processes: int) -> list[range]:
    """Agent numbers per process: contiguous, sizes differing by at most one.

    >>> blocks(10, 3)
    [range(0, 4), range(4, 7), range(7, 10)]
    """
    size, extra = divmod(agents, processes)
    starts = [k * size + min(k, extra) for k in range(processes + 1)]
    return [range(starts[k], starts[k + 1]) for k in range(processes)]


def start_fleets(
    supervisor: Supervisor,
    config: LocalConfig,
    coordinator: str,
    token: str,
    device_files: list[Path],
    extra: Sequence[str] = (),
) -> list[Child]:
    """Start ``config.in_process`` ``meshfl agent fleet`` children over ``config.agents``.

    ``device_files[i]`` is agent ``device-i``'s data: they must be ``DIR/device-{i}.npz``
    (:func:`models.datasets.write_partition`'s names). ``extra``: more ``agent fleet``
    options (``--coordinator-ca`` of a secure run).

    Raises
    ------
    meshfl.errors.ConfigError
        The data files are not named as the fleets will look for them.

    """
    template = str(device_files[0].parent / "device-{i}.npz")
    for i, path in enumerate(device_files[: config.agents]):
        if str(path) != template.replace("{i}", str(i)):
            raise ConfigError(f"in-process agents need device-{{i}}.npz data files, not {path}")
    children = []
    for k, block in enumerate(blocks(config.agents, config.in_process)):
        args = [
            "agent", "fleet", "--coordinator", coordinator,
            "--data", template, "--first", str(block.start), "--count", str(len(block)),
            "--name-prefix", "device-", "--out", str(config.out / "models"), "--once",
            "--label-column", config.label_column, "--poll", str(POLL_S),
            "--log-format", config.log_format, *extra,
            *(["--allow-model", config.model] if ":" in config.model else []),  # the user's own
        ]  # fmt: skip
        # the token in the environment, not in ps: only its user reads /proc/PID/environ
        children.append(supervisor.start(f"fleet-{k}", args, env={"MESHFL_TOKEN": token}))
    return children
