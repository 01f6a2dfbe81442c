"""Check the options of ``meshfl local`` before anything starts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.app.local.fleet import validate_fleet
from meshfl.app.local.inprocess import MAX_IN_PROCESS_AGENTS
from meshfl.app.local.lab.chaos import validate_chaos
from meshfl.contract import JOB_MODES, JOB_TOPOLOGIES, check_job_options
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.app.local.config import LocalConfig
    from meshfl.topology import Graph

__all__ = ["MAX_AGENTS", "canonical_topology", "is_graph_file", "topology_fields", "validate"]

MAX_AGENTS = 64
"""One process per agent (≈ 250 MB each with torch): past this, use a real fleet."""


def validate(config: LocalConfig) -> None:
    """Check the options before anything starts.

    Raises
    ------
    meshfl.errors.ConfigError
        An option is out of range; the message names it and the valid range.

    """
    most = MAX_IN_PROCESS_AGENTS if config.in_process else MAX_AGENTS
    if not 2 <= config.agents <= most:
        more = "" if config.in_process else f"; up to {MAX_IN_PROCESS_AGENTS} with --in-process K"
        raise ConfigError(f"--agents must be between 2 and {most} (got {config.agents}){more}")
    check_job_options(config.job_options())
    if not (math.isfinite(config.alpha) and config.alpha > 0):
        raise ConfigError(f"--alpha must be a positive number (got {config.alpha})")
    if config.model_seed is not None and not 0 <= config.model_seed < 2**32:
        raise ConfigError(f"--model-seed must be in [0, 2^32) (got {config.model_seed})")
    from meshfl.codecs import parse_codec

    parse_codec(config.codec)
    privacy = _validate_privacy(config)
    _validate_hidden(config.hidden)
    graph = _validate_topology(config)
    if graph is not None:  # a threshold above some degree: refused before anything starts
        degrees = {f"device-{k}": graph.degree(k) for k in range(config.agents)}
        try:
            privacy.check_degrees(degrees, config.codec)
        except ConfigError as exc:
            raise ConfigError(f"--secure-aggregation {config.secure_aggregation}: {exc}") from None
        _validate_budget(config, privacy, max(degrees.values(), default=1))
    if config.mode not in JOB_MODES:
        raise ConfigError(f"--mode {config.mode!r}: use one of {', '.join(JOB_MODES)}")
    validate_fleet(config)
    validate_chaos(config)
    if config.join_at and config.agents + len(config.join_at) > MAX_AGENTS:
        raise ConfigError(f"--agents plus --join-at agents must be at most {MAX_AGENTS}")
    if config.broker is not None:
        from edge_agent.transport.address import parse_broker_address

        parse_broker_address(config.broker)
    if config.byte_budget and parse_codec(config.codec).name not in ("topk", "randk"):
        raise ConfigError(
            "--byte-budget sets a sparsifier's density: use --codec topk:D or randk:D"
        )
    if config.algorithm == "dpsgd" and parse_codec(config.codec).spec not in ("identity",):
        raise ConfigError("--algorithm dpsgd sends whole models: use --codec identity")
    if config.momentum_kind == "quasi-global" and config.local_momentum == 0:
        raise ConfigError(
            "--momentum-kind quasi-global needs --local-momentum > 0 (β of its buffer);"
            " with 0 the steps are plain SGD"
        )
    _validate_dashboard(config)


def _validate_dashboard(config: LocalConfig) -> None:
    """``--dashboard-linger`` (given at all) and ``--open`` only with ``--dashboard``; ≥ 0 s."""
    linger = config.dashboard_linger_s
    if linger is not None and not linger >= 0:  # also refuses NaN; inf: until Ctrl-C
        raise ConfigError(f"--dashboard-linger must be a number of seconds >= 0 (got {linger})")
    if not config.dashboard and (config.open_browser or linger is not None):
        option = "--open" if config.open_browser else "--dashboard-linger"
        raise ConfigError(f"{option} needs --dashboard")


def is_graph_file(topology: str) -> bool:
    """Whether ``--topology`` names a JSON edge-list file rather than a kind."""
    return topology not in JOB_TOPOLOGIES and (
        topology.lower().endswith(".json") or Path(topology).is_file()
    )


def canonical_topology(topology: str) -> str:
    """``--topology`` with a kind's name in lower case (``Ring`` is ``ring``, as codecs are).

    A JSON edge-list file, or a name that is no kind, is returned as it is.
    """
    kind = topology.lower()
    return kind if kind in JOB_TOPOLOGIES and not is_graph_file(topology) else topology


def topology_fields(topology: str) -> dict[str, Any]:
    """Return the spec fields of ``--topology``: a kind, or ``custom`` with its graph.

    A JSON edge-list file is read here and sent as ``custom_graph: {"n", "edges"}``.

    Raises
    ------
    ConfigError
        An unknown kind (naming the valid ones), or a bad or disconnected file.

    """
    if not is_graph_file(topology):
        topology = canonical_topology(topology)
        kinds = [k for k in JOB_TOPOLOGIES if k != "custom"]
        if topology not in kinds:
            raise ConfigError(
                f"--topology {topology!r}: use one of {', '.join(kinds)},"
                " or a path to a JSON edge list"
            )
        return {"topology": topology}
    from meshfl.topology import from_edge_list

    graph = from_edge_list(topology)  # refuses a bad or disconnected file, naming it
    return {"topology": "custom", "custom_graph": {"n": graph.n, "edges": sorted(graph.edges)}}


def _validate_topology(config: LocalConfig) -> Graph | None:
    """A known kind buildable with its parameters, or a JSON edge list of --agents nodes.

    Returns the graph of a known kind (``None`` for an edge list, checked at the start).
    """
    from meshfl.topology import MIXING_RULES, build_graph

    if config.mixing not in MIXING_RULES:
        raise ConfigError(f"--mixing {config.mixing!r}: use one of {', '.join(MIXING_RULES)}")
    fields = topology_fields(config.topology)
    if "custom_graph" in fields:
        n = fields["custom_graph"]["n"]
        if n != config.agents:
            raise ConfigError(
                f"--topology {config.topology}: the graph has {n} nodes but --agents is"
                f" {config.agents}; make them equal"
            )
        return None
    try:
        return build_graph(
            config.topology,
            config.agents,
            degree=config.topology_degree,
            probability=config.topology_probability,
            seed=config.seed if config.topology_seed is None else config.topology_seed,
        )
    except ConfigError as exc:  # the kernel speaks of n, degree, p: name the options
        raise ConfigError(
            f"--topology {config.topology} with --agents {config.agents}: {exc}"
            " (the options: --agents, --degree, --probability, --topology-seed)"
        ) from None


def _validate_hidden(widths: tuple[int, ...] | None) -> None:
    """``--hidden`` within the bounds every job has (those the coordinator enforces)."""
    from meshfl.modelspec import MAX_HIDDEN_LAYERS, MAX_WIDTH

    if widths is None:
        return
    if len(widths) > MAX_HIDDEN_LAYERS:
        raise ConfigError(f"--hidden gives {len(widths)} widths; give at most {MAX_HIDDEN_LAYERS}")
    for width in widths:
        if not 1 <= width <= MAX_WIDTH:
            raise ConfigError(
                f"--hidden width {width} is out of range; use widths in [1, {MAX_WIDTH}]"
            )


def _validate_privacy(config: LocalConfig) -> PrivacyOptions:
    """Refuse privacy options that cannot work, with the same reasons as the REST API."""
    from meshfl.app.local.config import PRIVACY_FIELDS

    fields: dict[str, Any] = {key: getattr(config, key) for key in PRIVACY_FIELDS}
    fields.update(
        algorithm=config.algorithm,
        codec=config.codec,
        mode=config.mode,
        elastic=config.elastic or bool(config.join_at),
        topology=config.topology,
        keyframe_growth=config.keyframe_growth,
    )
    try:
        return PrivacyOptions.from_spec(fields)
    except ConfigError as exc:  # name the options, not the spec fields
        message = str(exc)
        for key in (*PRIVACY_FIELDS, "keyframe_growth"):
            message = message.replace(key, "--" + key.replace("_", "-"))
        raise ConfigError(message) from None


def _validate_budget(config: LocalConfig, privacy: PrivacyOptions, degree: int) -> None:
    """Refuse a run whose planned releases alone would cross ``--dp-epsilon-budget``.

    The fleet's devices are new, so this is the coordinator's start check without
    earlier spends, made before anything starts.
    """
    if not privacy.dp or privacy.epsilon_budget <= 0:
        return
    from coordinator.privacy import epsilon

    releases = config.rounds * (degree if privacy.secure else 1)
    planned = epsilon([(privacy.noise_multiplier, releases)], privacy.delta)
    if planned > privacy.epsilon_budget:
        raise ConfigError(
            f"--dp-epsilon-budget {privacy.epsilon_budget:g}: {config.rounds} rounds"
            f" ({releases} releases) would spend ε = {planned:.3g} at δ = {privacy.delta:g};"
            " use fewer --rounds, a larger --dp-noise-multiplier or a larger budget"
        )
