"""A job's privacy and robustness options, parsed and checked once for every caller.

The REST API, ``meshfl job start``, ``meshfl local`` and the agent all read the same
:class:`PrivacyOptions` from a :class:`~meshfl.contract.JobSpec`, so a combination that
cannot work is refused with the same one-line reason everywhere, before a job starts:

- **Secure aggregation** (Bonawitz et al., CCS 2017; SecAgg+, Bell et al., CCS 2020)
  sums *masked integers*: every sender of a neighbourhood must put its values on one
  fixed-point grid and on the same coordinates. Dense quantizers (``identity`` as 16-bit
  fixed point, ``int8``, ``qsgd:S``) and shared-seed ``randk`` fit; ``topk`` (each device
  picks its own coordinates, and the indices would reveal the delta), ``sign`` and
  ``powersgd`` (per-device scales and factors), ``fp16``/``bf16`` (floats cannot be
  masked modulo 2^b) and a ``+zstd`` layer (masked values are uniformly random) do not.
  It needs CHOCO-SGD in sync mode on a fixed graph.
- **Robust rules** (coordinate-wise median, trimmed mean, ClippedGossip) look at each
  neighbour's state separately, which masking exists to hide: they are refused together.
- **Differential privacy** at one of two units (``dp_unit``, docs/privacy.md): ``device``
  (the default) clips and noises each released *delta* (DP-FedAvg), so it needs
  CHOCO-SGD (D-PSGD sends models), and ``distributed`` noise is split across a securely
  aggregated neighbourhood, so it needs secure aggregation; ``record`` runs DP-SGD in
  the trainer (per-sample clipping and noise, Abadi et al. 2016), every release is
  post-processing, so it adds no noise to releases and combines with any algorithm.
- **Nothing else leaves a private device**: under DP or secure aggregation
  (:attr:`PrivacyOptions.private`) a device uploads no final model (``publish_model`` is
  refused) and its round reports carry no count sketch of its model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshfl.aggregation.secure import FixedPoint
from meshfl.contract.job_options import JOB_DEFAULTS, spec_value
from meshfl.errors import ConfigError

__all__ = [
    "DEFAULT_DP_DELTA",
    "DEFAULT_SECURE_RANGE",
    "DP_UNITS",
    "PrivacyOptions",
    "RobustRule",
    "check_threshold",
    "parse_robust",
    "secure_quantization_bits",
]

DEFAULT_DP_DELTA: float = JOB_DEFAULTS["dp_delta"]
"""δ of the (ε, δ) guarantee when a job names none (:mod:`meshfl.contract.job_options`)."""

DEFAULT_SECURE_RANGE: float = JOB_DEFAULTS["secure_range"]
"""±R: the fixed-point range of one coordinate of a masked contribution (the job option's
default, :mod:`meshfl.contract.job_options`)."""

DP_UNITS = ("device", "record")
"""The units of privacy a job may name (``dp_unit``): a device's whole dataset, or one
of its examples (records). docs/privacy.md, "Two units of privacy"."""

MIN_SIGMA, MAX_SIGMA = 0.01, 1e4
"""The noise multipliers a job accepts (the accountant's ε is finite and meaningful)."""
MIN_DELTA = 1e-12
MAX_SECURE_RANGE = 1e6

ROBUST_FORMS = "median, trimmed:BETA (0 <= BETA < 0.5), clipped-gossip"


@dataclass(frozen=True)
class RobustRule:
    """A robust mixing rule: ``name`` in ``median``, ``trimmed``, ``clipped-gossip``.

    ``beta`` is the fraction trimmed from each end (``trimmed`` only, in [0, 0.5)).
    """

    name: str
    beta: float = 0.0

    @property
    def spec(self) -> str:
        """The canonical text form (parses back to an equal rule)."""
        return f"trimmed:{self.beta:g}" if self.name == "trimmed" else self.name


def parse_robust(text: str) -> RobustRule:
    """Parse ``median``, ``trimmed:0.1`` or ``clipped-gossip``.

    Raises
    ------
    ConfigError
        Any other text; the message lists the valid forms.

    """
    if not isinstance(text, str):
        raise ConfigError(f"robust rule must be a string; valid forms: {ROBUST_FORMS}")
    name, colon, arg = text.strip().lower().partition(":")
    if name in ("median", "clipped-gossip") and not colon:
        return RobustRule(name)
    if name == "trimmed":
        try:
            beta = float(arg) if colon else 0.1
        except ValueError:
            beta = math.nan
        if math.isfinite(beta) and 0.0 <= beta < 0.5:
            return RobustRule("trimmed", beta)
    raise ConfigError(f"invalid robust rule {text!r}; valid forms: {ROBUST_FORMS}")


def secure_quantization_bits(codec_spec: str) -> tuple[int, float]:
    """Fixed-point bits per coordinate and density of a codec under secure aggregation.

    ``identity``/``fp32`` → (16, 1.0), ``int8[:CHUNK]`` → (8, 1.0), ``qsgd:S`` →
    (⌈log2(2S + 1)⌉, 1.0), ``randk:D`` → (16, D) on shared-seed coordinates.

    Raises
    ------
    ConfigError
        A codec that cannot be masked, with the reason and what to use instead.

    """
    text = codec_spec.strip().lower()
    base, plus, _ = text.partition("+")
    if plus:
        raise ConfigError(
            f"codec {codec_spec!r} cannot be used with secure aggregation: masked values are"
            " uniformly random, so a lossless layer cannot shrink them; drop '+zstd'"
        )
    name, _, arg = base.partition(":")
    if name in ("identity", "fp32"):
        return 16, 1.0
    if name == "int8":
        return 8, 1.0
    if name == "qsgd":
        levels = int(arg.partition(":")[0])
        return max(2, math.ceil(math.log2(2 * levels + 1))), 1.0
    if name == "randk":
        density, _, unbiased = arg.partition(":")
        if unbiased:
            raise ConfigError(
                f"codec {codec_spec!r} cannot be used with secure aggregation: its 1/density"
                " scaling would leave the fixed-point range; use randk:DENSITY"
            )
        return 16, float(density)
    why = {
        "topk": "each device keeps its own largest coordinates, so masked sums would not"
        " line up and the indices alone would reveal the delta; use randk:DENSITY"
        " (shared seed) or a dense quantizer (int8, qsgd:S)",
        "sign": "its per-device scale cannot be summed under a mask; use int8 or qsgd:S",
        "powersgd": "its per-device low-rank factors cannot be summed under a mask; use"
        " int8, qsgd:S or randk:DENSITY",
        "fp16": "floating-point values cannot be masked modulo 2^b; use identity (16-bit"
        " fixed point) or int8",
        "bf16": "floating-point values cannot be masked modulo 2^b; use identity (16-bit"
        " fixed point) or int8",
    }.get(name, "it is not a dense quantizer or shared-seed random-k")
    raise ConfigError(f"codec {codec_spec!r} cannot be used with secure aggregation: {why}")


def _number(spec: Mapping[str, Any], key: str) -> float:
    value = spec_value(spec, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PrivacyOptions:
    """The privacy and robustness options of one job (all off by default).

    Attributes
    ----------
    threshold : int
        t of secure aggregation: a neighbourhood unmasks when at least t of its members
        delivered their masked input; 0 disables secure aggregation.
    secure_range : float
        R: each coordinate of a masked contribution is clipped to [−R, R] (default 1.0).
    noise_multiplier : float
        σ: Gaussian noise of standard deviation σ·C per coordinate (0: no DP).
    clip : float
        C: the L2 norm each released delta is clipped to.
    mode : str
        ``local`` (each device adds all of its noise) or ``distributed`` (each member of
        a securely aggregated neighbourhood adds integer noise of variance σ²C²/t).
    delta : float
        δ of the (ε, δ) guarantee (default 1e-5).
    epsilon_budget : float
        ε_max per device over all its jobs (0: accounted, not capped).
    robust : RobustRule or None
        The robust mixing rule (``None``: plain weighted mixing).
    unit : str
        The unit of privacy, one of :data:`DP_UNITS`: ``device`` (σ and C apply to each
        released delta) or ``record`` (σ and C are DP-SGD's, applied to each minibatch's
        per-sample gradients in the trainer; releases carry no further noise).

    """

    threshold: int = 0
    secure_range: float = DEFAULT_SECURE_RANGE
    noise_multiplier: float = 0.0
    clip: float = 0.0
    mode: str = "local"
    delta: float = DEFAULT_DP_DELTA
    epsilon_budget: float = 0.0
    robust: RobustRule | None = None
    unit: str = "device"

    @property
    def secure(self) -> bool:
        """Whether secure aggregation is on."""
        return self.threshold > 0

    @property
    def dp(self) -> bool:
        """Whether differential privacy is on."""
        return self.noise_multiplier > 0

    @property
    def device_noise(self) -> bool:
        """Whether each released delta is clipped and noised (device-level DP)."""
        return self.dp and self.unit == "device"

    @property
    def record_dp(self) -> bool:
        """Whether the trainer runs DP-SGD (record-level DP; releases are post-processing)."""
        return self.dp and self.unit == "record"

    @property
    def dp_sgd(self) -> tuple[float, float] | None:
        """``(σ, C)`` for the trainer's DP-SGD at the ``record`` unit, else None."""
        return (self.noise_multiplier, self.clip) if self.record_dp else None

    @property
    def private(self) -> bool:
        """Whether the job is private (DP or secure aggregation).

        Nothing but what the privacy mechanism releases may leave a device of a private
        job: no count sketch of its model in round reports, no uploaded final model.
        """
        return self.dp or self.secure

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PrivacyOptions:
        """Read and check a job spec's options (see the module docstring).

        Raises
        ------
        ConfigError
            A value out of range or a combination that cannot work, with the reason.

        """
        threshold = spec_value(spec, "secure_aggregation")
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ConfigError(
                f"secure_aggregation must be an integer threshold >= 0, got {threshold!r}"
            )
        if threshold == 1:
            raise ConfigError(
                "secure aggregation threshold 1 lets one device unmask alone; use t >= 2"
                " (more than half the neighbourhood is recommended)"
            )
        secure_range = _number(spec, "secure_range")
        if secure_range <= 0:
            raise ConfigError(f"secure_range must be > 0, got {secure_range!r}")
        sigma = _number(spec, "dp_noise_multiplier")
        clip = _number(spec, "dp_clip")
        delta = _number(spec, "dp_delta")
        budget = _number(spec, "dp_epsilon_budget")
        mode = spec_value(spec, "dp_mode")
        if sigma < 0 or clip < 0 or budget < 0:
            raise ConfigError("dp_noise_multiplier, dp_clip and dp_epsilon_budget must be >= 0")
        if sigma and not MIN_SIGMA <= sigma <= MAX_SIGMA:
            raise ConfigError(
                f"dp_noise_multiplier must be in [{MIN_SIGMA:g}, {MAX_SIGMA:g}] (0: no DP), got"
                f" {sigma!r}: below it ε is unbounded, above it nothing is learned"
            )
        if secure_range > MAX_SECURE_RANGE:
            raise ConfigError(
                f"secure_range must be at most {MAX_SECURE_RANGE:g}, got {secure_range!r}"
            )
        if not MIN_DELTA <= delta < 1:
            raise ConfigError(f"dp_delta must be in [{MIN_DELTA:g}, 1), got {delta!r}")
        if mode not in ("local", "distributed"):
            raise ConfigError(f"dp_mode must be 'local' or 'distributed', got {mode!r}")
        robust_text = spec.get("robust")
        robust = None if robust_text in (None, "", "none") else parse_robust(robust_text)
        unit = spec.get("dp_unit", "device")
        if unit not in DP_UNITS:
            raise ConfigError(f"dp_unit must be 'device' or 'record', got {unit!r}")
        options = cls(threshold, secure_range, sigma, clip, mode, delta, budget, robust, unit)
        options._check_combination(spec)
        return options

    def _check_combination(self, spec: Mapping[str, Any]) -> None:
        algorithm = spec_value(spec, "algorithm")
        if self.dp and self.clip <= 0:
            raise ConfigError("dp_noise_multiplier needs dp_clip > 0 (the clipping norm C)")
        if self.clip > 0 and not self.dp:
            raise ConfigError("dp_clip without dp_noise_multiplier gives no privacy; set both")
        if self.epsilon_budget > 0 and not self.dp:
            raise ConfigError("dp_epsilon_budget needs dp_noise_multiplier > 0")
        if self.unit == "record" and not self.dp:
            raise ConfigError(
                "dp_unit record runs DP-SGD: set dp_noise_multiplier > 0 and dp_clip > 0"
                " (the per-sample clipping norm C)"
            )
        if self.record_dp and self.mode != "local":
            raise ConfigError(
                "dp_unit record adds its noise in training (DP-SGD), not to releases:"
                " dp_mode distributed does not apply; use dp_mode local"
            )
        if self.device_noise and algorithm != "choco":
            raise ConfigError(
                "differential privacy clips and noises a delta; D-PSGD sends whole models:"
                " use algorithm choco"
            )
        if self.device_noise and spec_value(spec, "keyframe_growth"):
            raise ConfigError(
                "error-triggered keyframes cannot repair a DP replica (under DP a keyframe"
                " re-sends the public replica, not the model): set keyframe_growth to 0"
            )
        if self.mode == "distributed" and self.dp and not self.secure:
            raise ConfigError(
                "dp_mode distributed splits the noise across a securely aggregated"
                " neighbourhood; set secure_aggregation (a threshold) or use dp_mode local"
            )
        if self.robust is not None and self.secure:
            raise ConfigError(
                f"robust rule {self.robust.spec!r} needs each neighbour's state, which secure"
                " aggregation hides; use one or the other"
            )
        if not self.secure:
            return
        if algorithm != "choco":
            raise ConfigError(
                "secure aggregation works with CHOCO-SGD's per-edge messages; use algorithm choco"
            )
        if spec_value(spec, "mode") != "sync":
            raise ConfigError(
                "secure aggregation needs sync rounds (every neighbourhood unmasks one round at a"
                " time); use mode sync"
            )
        if spec.get("elastic") or spec.get("topology") == "one-peer-exponential":
            raise ConfigError(
                "secure aggregation needs a fixed neighbourhood for the whole job; do not use"
                " elastic or one-peer-exponential"
            )
        if spec_value(spec, "keyframe_growth"):
            raise ConfigError(
                "keyframes are unmasked models; secure aggregation cannot send them: set"
                " keyframe_growth to 0"
            )
        secure_quantization_bits(str(spec.get("codec", "identity")))

    def check_release(self, spec: Mapping[str, Any]) -> None:
        """Refuse a private job that would release a device's un-noised model.

        Checked when a job is created (REST, ``meshfl job start``, ``meshfl local``) and
        by the agent before it runs one (a refusal declines the job). Not part of
        :meth:`from_spec`, so that a job stored before this rule still reads back.

        Raises
        ------
        ConfigError
            ``publish_model`` on a DP or secure-aggregation job.

        """
        if self.private and spec.get("publish_model"):
            raise ConfigError(
                "publish_model uploads each device's final model un-noised, which a private"
                " job (DP or secure aggregation) must not release; set publish_model false"
            )

    def noise_std_steps(self, step: float) -> float:
        """Std of one member's integer DP noise in grid steps of size ``step`` (0: no DP).

        ``local``: σC (each contribution is private on its own); ``distributed``: σC/√t,
        so that any t surviving members' noise sums to at least σC (Kairouz, Liu &
        Steinke, "The Distributed Discrete Gaussian Mechanism", ICML 2021, Section 4).
        0 at the ``record`` unit too: DP-SGD noised the training, releases add none.
        """
        if not self.device_noise:
            return 0.0
        std = self.noise_multiplier * self.clip
        if self.mode == "distributed":
            std /= math.sqrt(self.threshold)
        return std / step

    def fixed_point(self, codec: str, max_inputs: int) -> tuple[FixedPoint, float]:
        """The job's fixed-point encoding and random-k density.

        For neighbourhoods of at most ``max_inputs`` members: the modulus 2^b is the
        smallest that holds their sum and 8 standard deviations of their DP noise.
        Raises ConfigError when no modulus up to 2^62 does.
        """
        bits, density = secure_quantization_bits(codec)
        step = self.secure_range / (2 ** (bits - 1) - 1)
        noise = self.noise_std_steps(step)
        return FixedPoint.choose(self.secure_range, bits, max_inputs, noise), density

    def check_degrees(self, degrees: Mapping[str, int], codec: str = "identity") -> None:
        """Refuse a threshold above some device's degree, or an encoding that could overflow.

        An encoding overflows when no modulus up to 2^62 holds a neighbourhood's sum.
        ``degrees`` maps device id → number of neighbours. Raises ConfigError.
        """
        if not self.secure or not degrees:
            return
        self.fixed_point(codec, max(degrees.values()))
        for device in sorted(degrees, key=lambda d: (degrees[d], d)):
            check_threshold(self.threshold, degrees[device], device)


def check_threshold(threshold: int, size: int, aggregator: str) -> None:
    """Refuse a Shamir threshold outside (size/2, size] for one neighbourhood.

    An aggregator unmasks the sum of the members it declares survivors, and the
    coordinator checks only that they number at least t (the others it may call
    dropped: their masking keys are reconstructed, their inputs stay hidden). With c of
    those survivors colluding, the sum hides only t − c honest inputs: at ``t = 2`` an
    aggregator and one colluding member learn the other survivor's input whatever the
    degree. ``t > size/2`` makes every unmasked sum cover a majority of the
    neighbourhood, so unmasking one honest input takes at least ``t - 1 >= size // 2``
    colluding members (Bonawitz et al., CCS 2017, Section 4, choose t > n/2 against an
    active server; SecAgg+, Bell et al., CCS 2020, Section 3.3). A neighbourhood of 2
    (a ring) can only ever hide an input from its aggregator alone. ``t > size`` leaves
    nothing to reconstruct.

    Parameters
    ----------
    threshold : int
        t, the job's ``secure_aggregation``.
    size : int
        |N(i)|: the members of the aggregator's neighbourhood (its degree).
    aggregator : str
        The aggregator's device id, named in the error.

    Raises
    ------
    ConfigError
        ``threshold > size`` or ``2 * threshold <= size``, with the thresholds that work.

    """
    if threshold > size:
        raise ConfigError(
            f"secure aggregation threshold {threshold} exceeds the {size} neighbours of"
            f" device {aggregator}; use a threshold <= {size} or a denser topology"
        )
    if 2 * threshold <= size:
        raise ConfigError(
            f"secure aggregation threshold {threshold} is not above half of device"
            f" {aggregator}'s {size} neighbours: an aggregator and {threshold - 1} colluding"
            f" neighbour(s) could unmask one input; use a threshold of at least"
            f" {size // 2 + 1} or a sparser, more regular topology"
        )
