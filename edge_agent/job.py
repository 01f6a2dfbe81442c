"""One device's part in one job: train, gossip, evaluate, report — round by round."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.engines import EngineContext, build_engine
from edge_agent.final_model import publish_model, save_and_export
from edge_agent.job_profile import MIN_REFRESH_S, fresh_link, refresh_profile
from edge_agent.observer import AgentObserver, NullObserver, RoundSample, engine_counts
from edge_agent.reporter import Reporter
from edge_agent.rest import CoordinatorClient
from edge_agent.resume import Resumer
from edge_agent.round_engine import RoundEngine
from edge_agent.signing import Signer, Verifier
from edge_agent.transport.base import Transport
from edge_agent.versions import TopologyVersion
from meshfl import logcontext
from meshfl.aggregation import consensus_sketch
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import (
    Assignment,
    CapabilityProfile,
    PrivacySpend,
    RoundMetrics,
    spec_value,
)
from meshfl.errors import ConfigError, CoordinatorError, DataError, MeshflError
from meshfl.modelspec import check_allowed, check_hash, confine_path
from meshfl.pathids import path_id

if TYPE_CHECKING:
    from edge_agent.config import AgentConfig
    from edge_agent.secagg.crypto import IdentityKey
    from edge_agent.trainer import Trainer

__all__ = ["JobRunner"]

log = logging.getLogger("meshfl.agent.job")


class JobRunner:
    """Runs the rounds of one assignment and reports each to the coordinator.

    ``observer`` hears of the job's start and end and of every round
    (:mod:`edge_agent.observer`; default: nobody).

    The rounds' messages are the job's round engine's (:mod:`edge_agent.round_engine`,
    built by :mod:`edge_agent.engines`). A gossip job's engine checkpoints after every
    round; a runner that finds a usable checkpoint of its job resumes at the round after
    it, and removes it when the job ends for this device (:attr:`resume`,
    :mod:`edge_agent.resume`).
    """

    def __init__(
        self,
        config: AgentConfig,
        client: CoordinatorClient,
        transport: Transport,
        device_id: str,
        assignment: Assignment,
        link: CapabilityProfile | None = None,
        identity: IdentityKey | None = None,
        observer: AgentObserver | None = None,
    ) -> None:
        self.config = config
        self.observer: AgentObserver = observer or NullObserver()
        self.epsilon: float | None = None  # ε this DP job spent on the device so far
        self.identity = identity  # the enrolled Ed25519 key (secure aggregation signs with it)
        self.link = link  # the latest link figures (with measured_at), if any
        self.client = client
        self.transport = transport
        self.device_id = device_id
        self.assignment = assignment
        self.spec = assignment["spec"]
        self.job_id = assignment["job_id"]
        self.privacy = PrivacyOptions()
        self.signer: Signer | None = None  # set by run() for a signed_deltas job
        self.verifier: Verifier | None = None
        self._spent = False  # whether this run recorded a DP release yet (see _spend)

    @cached_property
    def resume(self) -> Resumer:
        """The job's checkpoints (:class:`~edge_agent.resume.Resumer`), made on first use."""
        return Resumer(self.config.out, self.config.name, self.job_id, self.spec)

    def run(self, x: np.ndarray, y: np.ndarray) -> None:
        """Run every round of the job on local data ``x`` (n, d) float32, ``y`` (n,) int64.

        Log lines meanwhile carry the device and job ids (:mod:`meshfl.logcontext`).
        """
        with logcontext.bind(device=self.device_id, job=self.job_id):
            self._run(x, y)

    def _run(self, x: np.ndarray, y: np.ndarray) -> None:
        from models.data import check_model_fit

        spec = self.spec
        path_id(self.job_id, "job id")  # it names a folder: a '..' from the coordinator is
        path_id(self.config.name, "device name")  # declined before any file is written
        self.privacy = PrivacyOptions.from_spec(spec)  # ConfigError: the job is declined
        self.privacy.check_release(spec)  # a private job publishing models: declined
        self.signer, self.verifier = self._signing()
        # Only the zoo and the owner's allowed factories; checked before anything is imported.
        check_allowed(spec["model"], self.config.allowed_models)  # SecurityError: declined
        check_model_fit(x, y, spec["model"], self.config.data)  # errors name the file
        x_test, y_test = self._test_data()
        test_path = self.config.test_data or spec.get("test_data") or self.config.data
        check_model_fit(x_test, y_test, spec["model"], test_path)
        # Polling from here on: a device that sets up (profile, link probe, a joiner's
        # catch-up) is alive to the coordinator, which takes a silent one for departed.
        reporter = Reporter(self.client, self.device_id, self.job_id, self.config.poll_s)
        try:
            self._setup(reporter, x, y, x_test, y_test)
        except BaseException:
            with contextlib.suppress(MeshflError):  # the job's own error is the one to raise
                reporter.close()
            raise
        reporter.close()  # closed after the rounds already: a second close does nothing

    def _setup(
        self,
        reporter: Reporter,
        x: np.ndarray,
        y: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
    ) -> None:
        """Build the trainer and the engine, measure the profile, and run the job."""
        from edge_agent.capability_probe import capability_profile
        from edge_agent.trainer import Trainer

        spec = self.spec
        trainer = Trainer(
            spec["model"],
            seed=spec["seed"],  # every device starts from the same weights
            data_seed=spec["seed"] + 1 + self.assignment["index"],  # its own shuffles
            learning_rate=spec["learning_rate"],
            batch_size=spec["batch_size"],
            local_epochs=spec["local_epochs"],
            threads=self.config.threads,
            slowdown=self.config.slowdown,
            step_time_s=self.config.step_time_s,
            momentum=spec.get("local_momentum", 0.0),
            momentum_kind=spec_value(spec, "momentum_kind"),
            dp_sgd=self.privacy.dp_sgd,  # record-level DP: (σ, C) of DP-SGD, else None
        )
        check_hash(spec["model"], trainer.spec_hash)  # a different model build: decline
        # Measured before the engine starts: the link probe borrows the transport's handler.
        profile = capability_profile(trainer, x, y)
        fleet = self.assignment["fleet"]
        link = fresh_link(
            self.link, self.config.profile_refresh_s, self.transport, fleet, self.device_id
        )
        profile.update(link)
        self.client.put_profile(self.device_id, profile)
        if self.privacy.device_noise:
            self._warn_dp(sum(int(a.size) for a in trainer.params().values()))
        topo = TopologyVersion.from_assignment(self.assignment)
        self.versions = {topo.version: topo}
        context = EngineContext(
            config=self.config,
            client=self.client,
            transport=self.transport,
            device_id=self.device_id,
            assignment=self.assignment,
            privacy=self.privacy,
            resume=self.resume,
            identity=self.identity,
            signer=self.signer,
            verifier=self.verifier,
        )
        engine = build_engine(context, trainer, topo)
        resumed = self.resume.checkpoint
        if resumed is not None and resumed.epsilon is not None:
            self.epsilon = resumed.epsilon
        engine.start()
        self.observer.job_started(self.job_id, engine.queue_depth)
        try:
            round_ = engine.prepare(max(1, self.assignment["start_round"]), trainer)
            self._rounds(engine, trainer, topo, round_, x, y, x_test, y_test, profile, reporter)
        finally:
            self.observer.job_finished(self.job_id)

    def _spend(self, body: PrivacySpend) -> bool:
        """Record a round's DP releases (or DP-SGD steps) at the coordinator first; False: over."""
        round_ = body["round"]
        if not self._spent:  # this run's first: an earlier run may have released this round
            body["new_run"] = True
        try:
            status = self.client.spend(self.job_id, self.device_id, body)
        except CoordinatorError as exc:
            if exc.status != 409:
                raise
            log.warning("round %d: stopping before the privacy budget is crossed: %s", round_, exc)
            return False
        self._spent = True
        self.epsilon = float(status["epsilon_spent"])
        log.debug("round %d: ε spent %.3f", round_, self.epsilon)
        return True

    def _rounds(
        self,
        engine: RoundEngine,
        trainer: Trainer,
        topo: TopologyVersion,
        round_: int,
        x: np.ndarray,
        y: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
        profile: CapabilityProfile,
        reporter: Reporter,
    ) -> None:
        spec = self.spec
        refresh_s = self.config.profile_refresh_s
        measured = time.monotonic()
        releases = len(topo.peers()) if self.privacy.secure else 1
        sent0, received0 = self.transport.bytes_sent, self.transport.bytes_received
        sent, received = sent0, received0  # counters at the end of the previous round
        accuracy = 0.0
        refused = _refused(engine)  # counters at the end of the previous round
        self.plan = self.assignment["plan"]
        # Reports go out on the reporter's thread: no round waits for the coordinator.
        for report in self.resume.unposted:  # maybe never posted before a crash
            reporter.post_metrics(report)
        try:
            while round_ <= spec["rounds"]:
                if self.privacy.dp and not self._spend(trainer.dp_spend(len(y), round_, releases)):
                    break
                topo = engine.switch(round_, topo, self.versions)
                if topo.removed:
                    log.info(
                        "removed from job %s at round %d (topology v%d)",
                        self.job_id,
                        round_,
                        topo.version,
                    )
                    break
                started = time.perf_counter()
                result = trainer.train(x, y, work_fraction=float(self.plan["work_fraction"]))
                if not math.isfinite(result.loss):
                    raise ConfigError(
                        f"training diverged at round {round_} (loss {result.loss}); lower the"
                        " job's learning rate"
                    )
                no_wait = self.plan.get("no_wait", ())
                params, missing = engine.exchange(round_, trainer.params(), no_wait)
                trainer.finish_round(params)
                if round_ >= spec["rounds"]:
                    engine.linger()  # e.g. repairs of the last message
                accuracy, loss = trainer.evaluate(x_test, y_test)
                now_sent, now_received = self.transport.bytes_sent, self.transport.bytes_received
                metrics: RoundMetrics = {
                    "round": round_,
                    "accuracy": accuracy,
                    "loss": loss,
                    "bytes_sent": now_sent - sent,
                    "bytes_received": now_received - received,
                    "missing": missing,
                    "sketch": self._sketch(params),
                    "train_s": result.seconds,
                    "round_s": time.perf_counter() - started,
                }
                sent, received = now_sent, now_received
                if self.verifier is not None:
                    now_refused = _refused(engine)
                    metrics["rejected_unsigned"] = now_refused[0] - refused[0]
                    metrics["rejected_signature"] = now_refused[1] - refused[1]
                    metrics["rejected_replayed"] = now_refused[2] - refused[2]
                    refused = now_refused
                ledger = engine.take_ledger(final=round_ >= spec["rounds"])
                if ledger is not None:  # docs/reliability.md
                    metrics["ledger"] = ledger
                log.info("round %d: accuracy %.4f, loss %.4f", round_, accuracy, loss)
                epsilon = self.epsilon if self.privacy.dp else None
                engine.checkpoint(round_, trainer, epsilon, metrics)  # before it is posted
                reporter.post_metrics(metrics)
                self._observe(metrics, engine)
                if (
                    refresh_s > 0
                    and round_ < spec["rounds"]
                    and time.monotonic() - measured >= max(MIN_REFRESH_S, refresh_s)
                ):
                    # Between rounds only; the probe forwards neighbours' early deltas to the
                    # engine's handler, so nothing of the next round is lost.
                    fleet = self.assignment["fleet"]
                    profile = refresh_profile(profile, self.transport, fleet, self.device_id)
                    reporter.put_profile(profile)
                    measured = time.monotonic()
                if round_ < spec["rounds"] and self._poll(reporter):
                    log.info("job %s was stopped by the coordinator", self.job_id)
                    break
                nxt = engine.next_round(round_)
                if nxt <= spec["rounds"] and self._hold(reporter, nxt):
                    log.info("job %s was stopped by the coordinator while paused", self.job_id)
                    break
                round_ = nxt
        finally:
            reporter.close()
        path = self.config.out / self.job_id / self.config.name / "model.pt"  # checked ids
        model_path, onnx_path, onnx_diff = save_and_export(trainer, path, x_test)
        if spec.get("publish_model") and onnx_path is not None and not self.privacy.private:
            # before done: a completed job has every model
            publish_model(self.client, self.job_id, self.device_id, Path(onnx_path))
        # Done first: a flush on a slow link can take seconds, and the coordinator takes
        # a participant silent that long after the others finished for a dead one.
        self.client.post_done(
            self.job_id,
            {
                "final_accuracy": accuracy,
                "bytes_sent": self.transport.bytes_sent - sent0,
                "bytes_received": self.transport.bytes_received - received0,
                "model_path": model_path,  # "": not written (the disk refused it)
                "onnx_path": onnx_path,
                "onnx_max_abs_diff": onnx_diff,
            },
        )
        self.resume.remove()  # the job is over for this device
        engine.leave()
        self.transport.flush(10.0)
        if engine.stats.rejected:
            log.warning("rejected %d malformed messages", engine.stats.rejected)
        unsigned, bad, replayed = _refused(engine)
        if unsigned or bad or replayed:
            log.warning(
                "refused %d unsigned, %d badly signed and %d replayed messages",
                unsigned,
                bad,
                replayed,
            )

    def _observe(self, metrics: RoundMetrics, engine: RoundEngine) -> None:
        """Tell the observer about a reported round: its figures and the engine's counts."""
        applied, dropped, rejected = engine_counts(engine.stats)
        self.observer.round_finished(
            RoundSample(
                job=self.job_id,
                round=metrics["round"],
                seconds=metrics["round_s"],
                bytes_sent=metrics["bytes_sent"],
                bytes_received=metrics["bytes_received"],
                applied=applied,
                dropped=dropped,
                rejected=rejected,
                epsilon=self.epsilon if self.privacy.dp else None,
            )
        )

    def _signing(self) -> tuple[Signer | None, Verifier | None]:
        """The job's signer and verifier; ``(None, None)`` if ``signed_deltas`` is false.

        Raises
        ------
        ConfigError
            The job is signed but this device has no identity key (the job is declined).

        """
        if not self.spec.get("signed_deltas", True):
            return None, None
        if self.identity is None:
            raise ConfigError(
                f"job {self.job_id} signs its deltas and this device has no identity key;"
                " enrol it again with `meshfl agent run --token ...`"
            )
        return Signer(self.identity), Verifier(self.assignment.get("peer_keys", {}))

    def _poll(self, reporter: Reporter) -> bool:
        """Take the latest assignment read: a newer topology version; True if stopped."""
        polled, current = reporter.assignment()
        if not polled:
            return False
        if current is None or current["job_id"] != self.job_id:
            return current is None
        if current["status"] == "stopped":
            return True
        version = TopologyVersion.from_assignment(current)
        self.versions.setdefault(version.version, version)
        self.plan = current["plan"]
        if self.verifier is not None:  # devices that joined since: verify their deltas
            self.verifier.update(current.get("peer_keys", {}))
        return False

    def _hold(self, reporter: Reporter, next_round: int) -> bool:
        """Wait while the job is paused before ``next_round``; True if it was stopped meanwhile.

        The pause holds from the assignment's ``pause_round`` on (a device that learns of
        it a round late waits before its next round). The reporter keeps polling every
        ``poll_s`` while this thread waits on its polls; each poll counts as this device's
        activity, so the coordinator never takes a waiting device for a dead one.
        """
        if not self._paused(reporter, next_round):
            return False
        log.info("job %s is paused: waiting before round %d", self.job_id, next_round)
        wait_s = max(1.0, 4 * self.config.poll_s)
        while self._paused(reporter, next_round):
            reporter.wait_for_poll(wait_s)
            if self._poll(reporter):
                return True
        log.info("job %s resumed: round %d starts", self.job_id, next_round)
        return False

    def _paused(self, reporter: Reporter, next_round: int) -> bool:
        """Whether the latest assignment holds this job before ``next_round``."""
        _, current = reporter.assignment()
        return (
            current is not None
            and current["job_id"] == self.job_id
            and current["status"] == "paused"
            and next_round >= int(current.get("pause_round", 0))
        )

    def _warn_dp(self, n: int) -> None:
        """Say up front when the DP noise of a release dwarfs what a round can correct."""
        sigma, clip = self.privacy.noise_multiplier, self.privacy.clip
        ratio = sigma * math.sqrt(n)
        log.info("differential privacy: σ %g, C %g, %s mode", sigma, clip, self.privacy.mode)
        if ratio > 10:
            log.warning(
                "DP noise of norm ≈ σ·C·√n = %.3g per release is %.0f× the clipping norm C:"
                " the public replicas will drift and accuracy will be low; see"
                " docs/privacy.md (What DP costs)",
                ratio * clip,
                ratio,
            )

    def _sketch(self, params: dict[str, np.ndarray]) -> list[float]:
        dim = self.spec["sketch_dim"]
        if dim <= 0 or self.privacy.private:  # un-noised: never sent from a private job
            return []
        return [float(v) for v in consensus_sketch(params, dim, self.spec["seed"])]

    def _test_data(self) -> tuple[np.ndarray, np.ndarray]:
        from models.data import check_labels, load_dataset_file

        if self.config.test_data is not None:  # the owner's own choice
            return load_dataset_file(Path(self.config.test_data), self.config.label_column)
        if self.spec["test_data"] is not None:  # the job's: only inside the data directory
            path = confine_path(self.spec["test_data"], self.config.data_root)
            return load_dataset_file(path, self.config.label_column)
        if self.config.data.suffix == ".npz":
            with np.load(self.config.data) as arrays:
                if "x_test" in arrays and "y_test" in arrays:
                    labels = check_labels(self.config.data, arrays["y_test"])  # 3.5: refused
                    return arrays["x_test"].astype(np.float32), labels
        raise DataError(
            f"job {self.job_id} names no test data and {self.config.data} has no"
            " x_test/y_test arrays; pass --test-data FILE"
        )


def _refused(engine: RoundEngine) -> tuple[int, int, int]:
    """The engine's refusal counters so far: (unsigned, bad signature, replayed)."""
    stats = engine.stats
    return stats.unsigned, stats.bad_signature, stats.replayed
