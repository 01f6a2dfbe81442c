"""CHOCO-SGD (Koloskova et al., ICML 2019): compressed differences to public replicas.

The device's codec policy (per tensor; sparser when the planner set a tighter byte
budget than the job's) and, in a DP job, the local-DP privatizer of each released
difference come with it.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from edge_agent.round_engine import Params
from edge_agent.versions import TopologyVersion
from meshfl.aggregation import ChocoGossip, GaussianPrivatizer, GossipAlgorithm
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.codecs import CodecPolicy, parse_codec
from meshfl.contract import Assignment
from meshfl.errors import ConfigError

__all__ = ["build", "codec_policy"]

log = logging.getLogger("meshfl.agent.job")


def build(
    assignment: Assignment, privacy: PrivacyOptions, params: Params, topology: TopologyVersion
) -> GossipAlgorithm:
    """CHOCO-SGD's state for this device, mixing with ``topology``'s row of its first round.

    Every device starts from the same seeded x⁰: the replicas of every peer of the first
    version are exact from round one (a joiner asks for keyframes).
    """
    spec = assignment["spec"]
    weights, self_weight = topology.row(max(1, assignment["start_round"]))
    listen = topology.peers()
    policy = codec_policy(assignment, params)
    log.info(
        "codecs per tensor: %s",
        ", ".join(f"{name} {policy.codec_for(name, a.shape).spec}" for name, a in params.items()),
    )
    choco = ChocoGossip(
        params,
        {p: 1.0 / len(listen) for p in listen} if listen else {},
        0.0 if listen else 1.0,
        consensus_step=spec["consensus_step"],
        codec=policy,
        shared_start=True,
        keyframe_growth=spec.get("keyframe_growth", 0.0),
        privatizer=privatizer(privacy),
        robust=privacy.robust,
    )
    choco.set_neighbours(weights, self_weight, listen=listen)
    return choco


def privatizer(privacy: PrivacyOptions) -> GaussianPrivatizer | None:
    """Local DP (McMahan et al., ICLR 2018): clip each released difference, add noise."""
    if not privacy.device_noise:  # record-level DP: releases are post-processing
        return None
    # OS entropy: the noise must not be predictable from the job's public seed.
    rng = np.random.default_rng()
    return GaussianPrivatizer(privacy.clip, privacy.noise_multiplier, rng)


def codec_policy(assignment: Assignment, params: Params) -> CodecPolicy:
    """The job's codec policy, made sparser if the planner gave a tighter byte budget.

    The planner's budget (``plan["byte_budget"]``, bytes per message; 0: none) applies
    to a top-k or random-k codec only; a denser plan than the job's is ignored.
    """
    spec = assignment["spec"]
    layout = [(name, tuple(a.shape)) for name, a in params.items()]
    codec = parse_codec(spec["codec"])
    dense_below = spec.get("dense_below", 0)
    policy = CodecPolicy.from_options(
        codec, layout, dense_below=dense_below, byte_budget=spec.get("byte_budget", 0)
    )
    budget = int(assignment["plan"]["byte_budget"])
    if budget <= 0:
        return policy
    largest = max(layout, key=lambda t: math.prod(t[1]))
    sparsifier = policy.codec_for(*largest)
    density = getattr(sparsifier, "density", None)
    if sparsifier.name not in ("topk", "randk") or density is None:
        log.warning("planned byte budget %d ignored: codec %s has no density", budget, codec.spec)
        return policy
    try:
        planned = CodecPolicy.for_budget(budget, layout, sparsifier.name, dense_below)
    except ConfigError as exc:
        log.warning("planned byte budget %d ignored: %s", budget, exc)
        return policy
    planned_density = getattr(planned.codec_for(*largest), "density", 1.0)
    if planned_density >= density:
        return policy
    log.info(
        "planned byte budget %d B: %s density %.4g instead of %.4g",
        budget,
        sparsifier.name,
        planned_density,
        density,
    )
    return planned
