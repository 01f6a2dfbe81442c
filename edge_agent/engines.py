"""Which round engine a job gets, and how it is built: the one place that knows.

A secure-aggregation job (``privacy.secure_aggregation``) gets a
:class:`~edge_agent.secure_engine.SecureEngine`; every other job gets
:class:`~edge_agent.gossip_rounds.GossipRounds` over a
:class:`~edge_agent.engine.GossipEngine` running the algorithm its spec names,
looked up in :data:`ALGORITHMS`. **A new gossip algorithm** is one module of
:mod:`edge_agent.algorithms` with a ``build`` function (an
:data:`AlgorithmFactory`) and one entry here; the job runner does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_agent.algorithms import choco, dpsgd
from edge_agent.engine import GossipEngine
from edge_agent.gossip_rounds import GossipRounds
from edge_agent.rest import CoordinatorClient
from edge_agent.resume import Resumer
from edge_agent.round_engine import Params, RoundEngine
from edge_agent.secure_engine import SecureEngine
from edge_agent.secure_job import build_secure_engine
from edge_agent.signing import Signer, Verifier
from edge_agent.transport.base import Transport
from edge_agent.versions import TopologyVersion
from meshfl.aggregation import GossipAlgorithm
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import Assignment
from meshfl.errors import ConfigError, CoordinatorError, CoordinatorUnreachable

if TYPE_CHECKING:
    from edge_agent.config import AgentConfig
    from edge_agent.secagg.crypto import IdentityKey
    from edge_agent.trainer import Trainer

__all__ = ["ALGORITHMS", "AlgorithmFactory", "EngineContext", "build_engine"]

AlgorithmFactory = Callable[[Assignment, PrivacyOptions, Params, TopologyVersion], GossipAlgorithm]
"""``(assignment, privacy, params, topology) -> algorithm``: a device's gossip state,
mixing with ``topology``'s row of its first round, every replica starting at ``params``."""

ALGORITHMS: Mapping[str, AlgorithmFactory] = {"choco": choco.build, "dpsgd": dpsgd.build}
"""The job spec's ``algorithm`` names (:class:`meshfl.contract.JobSpec`) → their builders."""


@dataclass(frozen=True)
class EngineContext:
    """What a round engine is built from: one device's part in one job.

    ``identity`` is the enrolled Ed25519 key (None: not enrolled with one; a secure job
    needs it). ``signer``/``verifier`` sign and check every envelope of a
    ``signed_deltas`` job (None: unsigned). ``resume`` holds the job's checkpoints.
    """

    config: AgentConfig
    client: CoordinatorClient
    transport: Transport
    device_id: str
    assignment: Assignment
    privacy: PrivacyOptions
    resume: Resumer
    identity: IdentityKey | None = None
    signer: Signer | None = None
    verifier: Verifier | None = None


def build_engine(
    context: EngineContext, trainer: Trainer, topology: TopologyVersion
) -> RoundEngine:
    """The job's round engine, not started yet.

    A gossip job resumes from its checkpoint if it has a usable one: the trainer's
    model, shuffling state and momentum and the algorithm's own replica are put back
    (:class:`~edge_agent.resume.Resumer`).

    Raises
    ------
    ConfigError
        An algorithm this agent does not know; a secure job on a device without an
        identity key, or one whose setup the coordinator refused; invalid options.

    """
    if context.privacy.secure:
        return _secure(context, trainer.params())
    return _gossip(context, trainer, topology)


def _gossip(context: EngineContext, trainer: Trainer, topology: TopologyVersion) -> GossipRounds:
    spec = context.assignment["spec"]
    build = ALGORITHMS.get(spec["algorithm"])
    if build is None:
        raise ConfigError(
            f"unknown algorithm {spec['algorithm']!r}; this agent runs {', '.join(ALGORITHMS)}"
        )
    resumed = context.resume.load(trainer, topology)
    params = trainer.params()
    engine = GossipEngine(
        transport=context.transport,
        fleet=context.assignment["fleet"],
        job_id=context.assignment["job_id"],
        device_id=context.device_id,
        neighbours=sorted(topology.peers()),
        algorithm=build(context.assignment, context.privacy, params, topology),
        deadline_s=spec["round_deadline_s"],
        max_payload=spec["max_payload_bytes"],
        mode=spec.get("mode", "sync"),
        staleness=spec.get("staleness", 2),
        quorum=spec.get("quorum", 1.0),
        signer=context.signer,
        verifier=context.verifier,
        first_sequence=0 if resumed is None else resumed.first_sequence,
        outbox_folder=context.resume.outbox_folder,
        offline_grace_s=context.config.offline_grace_s,
    )
    context.resume.restore(engine, trainer, topology)
    return GossipRounds(engine, topology, context.resume)


def _secure(context: EngineContext, params: Params) -> SecureEngine:
    if context.identity is None:
        raise ConfigError(
            "secure aggregation needs this device's identity key; enrol it again with"
            " `meshfl agent run --token ...`"
        )
    try:
        return build_secure_engine(
            client=context.client,
            transport=context.transport,
            identity=context.identity,
            device_id=context.device_id,
            assignment=context.assignment,
            params=params,
            options=context.privacy,
            timeout_s=max(60.0, context.assignment["spec"]["round_deadline_s"]),
            signer=context.signer,
            verifier=context.verifier,
        )
    except CoordinatorUnreachable:
        raise
    except CoordinatorError as exc:  # a refusal: this device cannot take part
        raise ConfigError(f"secure aggregation setup refused: {exc}") from exc
