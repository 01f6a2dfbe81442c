"""Setting up a device's part in a secure-aggregation job: keys, directory, engine.

The device publishes its signed per-job key bundle to the coordinator (the public-key
directory), waits until every participant's bundle is there, verifies each one against
the participant's enrolled Ed25519 identity key, and builds the
:class:`~edge_agent.secure_engine.SecureEngine` with the job's fixed-point encoding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import numpy as np

from edge_agent.rest import CoordinatorClient
from edge_agent.secagg.crypto import IdentityKey, JobKeys, ParsedBundle, verify_bundle
from edge_agent.secagg.keyring import Directory
from edge_agent.secure_engine import SecureEngine
from edge_agent.signing import Verifier
from edge_agent.transport.base import Transport
from meshfl.aggregation import SecureChoco
from meshfl.aggregation.privacy import PrivacyOptions, check_threshold
from meshfl.contract import Assignment, SecAggDirectory
from meshfl.errors import ConfigError, CoordinatorError, SecurityError
from meshfl.wire.serde import Sign

__all__ = ["build_secure_engine", "check_shares"]

log = logging.getLogger("meshfl.agent.secure")


def _directory(reply: SecAggDirectory, rounds: int) -> Directory:
    """Verify every bundle against its device's identity key; build the directory."""
    neighbourhoods = {d: tuple(sorted(n)) for d, n in reply["neighbourhoods"].items()}
    bundles: dict[str, ParsedBundle] = {}
    for device, bundle in reply["bundles"].items():
        identity = reply["identity_keys"].get(device)
        if identity is None:
            raise SecurityError(f"the key directory has no identity key for {device}")
        slots = len(neighbourhoods.get(device, ()))
        parsed = verify_bundle(bundle, identity, rounds, max(1, slots))
        if parsed.device != device or parsed.job != reply["job_id"]:
            raise SecurityError(f"the directory's bundle for {device} names another device or job")
        bundles[device] = parsed
    return Directory(
        threshold=reply["threshold"],
        coordinator_key=reply["coordinator_key"],
        neighbourhoods=neighbourhoods,
        bundles=bundles,
    )


def check_shares(
    directory: Directory, options: PrivacyOptions, aggregators: Mapping[str, float]
) -> None:
    """Refuse to share secrets under a threshold the job did not set, or one too low.

    Before this device splits its secrets among each of its aggregators' neighbourhoods
    N(i): the directory's threshold t must be the job's, and each |N(i)| must satisfy
    ``|N(i)|/2 < t <= |N(i)|`` (:func:`meshfl.aggregation.privacy.check_threshold`). The
    coordinator checks the same at job creation and start; the device checks again
    because it is the one whose input is at stake.

    Raises
    ------
    SecurityError
        The directory's threshold differs from the job spec's.
    ConfigError
        Some aggregator's neighbourhood is outside the safe range for t.

    """
    if directory.threshold != options.threshold:
        raise SecurityError(
            f"the key directory's threshold {directory.threshold} is not the job's"
            f" secure_aggregation {options.threshold}; not sharing any secret"
        )
    for aggregator in sorted(aggregators):
        members = directory.neighbourhoods.get(aggregator, ())
        check_threshold(directory.threshold, len(members), aggregator)


def build_secure_engine(
    *,
    client: CoordinatorClient,
    transport: Transport,
    identity: IdentityKey,
    device_id: str,
    assignment: Assignment,
    params: Mapping[str, np.ndarray],
    options: PrivacyOptions,
    timeout_s: float,
    signer: Sign | None = None,
    verifier: Verifier | None = None,
) -> SecureEngine:
    """Publish this device's keys, fetch the verified directory, build the engine.

    ``signer``/``verifier`` sign and check every envelope of a ``signed_deltas`` job
    (``None``: unsigned).

    Raises
    ------
    ConfigError
        The directory was not complete within ``timeout_s`` seconds, or the job's encoding
        cannot hold a neighbourhood sum.
    SecurityError
        A bundle's signature does not verify against its device's identity key.

    """
    spec = assignment["spec"]
    job_id = assignment["job_id"]
    slots = max(1, len(assignment["neighbours"]))  # one masking key per aggregator a round
    keys = JobKeys.create(job_id, device_id, spec["rounds"], slots)
    client.put_key_bundle(job_id, device_id, keys.bundle(identity))  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout_s
    while True:
        reply = client.get_directory(job_id)
        if reply["complete"]:
            break
        if time.monotonic() >= deadline:
            absent = sorted(set(reply["neighbourhoods"]) - set(reply["bundles"]))
            raise ConfigError(
                f"secure aggregation: devices {absent} published no keys within {timeout_s:.0f} s;"
                " check that they run an agent with secure-aggregation support"
            )
        time.sleep(0.2)
    directory = _directory(reply, spec["rounds"])
    neighbours = {n["device_id"]: float(n["weight"]) for n in assignment["neighbours"]}
    if set(neighbours) != set(directory.neighbourhoods.get(device_id, ())):
        raise CoordinatorError(
            f"the key directory's neighbourhood of {device_id} differs from its assignment"
        )
    check_shares(directory, options, neighbours)
    largest = max((len(v) for v in directory.neighbourhoods.values()), default=1)
    fixed_point, density = options.fixed_point(spec["codec"], largest)
    algorithm = SecureChoco(
        params,
        neighbours,
        assignment["self_weight"],
        consensus_step=spec["consensus_step"],
        fixed_point=fixed_point,
        density=density,
        dp_clip=options.clip if options.device_noise else 0.0,  # record-level: no release clip
        dp_noise_std=options.noise_std_steps(fixed_point.step),
    )
    log.info(
        "secure aggregation: threshold %d, %d-bit fixed point in ±%g, modulus 2^%d%s",
        directory.threshold,
        fixed_point.bits,
        fixed_point.range_,
        fixed_point.modulus_bits,
        f", random-k density {density:g}" if density < 1 else "",
    )
    return SecureEngine(
        transport=transport,
        declare=lambda d: client.post_declaration(job_id, d),
        fleet=assignment["fleet"],
        job_id=job_id,
        device_id=device_id,
        directory=directory,
        keys=keys,
        algorithm=algorithm,
        fixed_point=fixed_point,
        density=density,
        deadline_s=spec["round_deadline_s"],
        max_payload=spec["max_payload_bytes"],
        rng=np.random.default_rng(),
        signer=signer,
        verifier=verifier,
    )
