"""Job options shared by ``meshfl local`` and ``meshfl job start`` (one definition each)."""

from __future__ import annotations

from typing import Annotated

import typer

Topology = Annotated[
    str,
    typer.Option(
        help="ring, torus, exponential, one-peer-exponential, random-regular, erdos-renyi,"
        " small-world, star, complete, or a path to a JSON edge list {n, edges}."
    ),
]
Algorithm = Annotated[str, typer.Option(help="choco (CHOCO-SGD, compressed) or dpsgd.")]
CodecSpec = Annotated[
    str, typer.Option(help="Codec spec, e.g. topk:0.1, sign, int8+zstd (docs/codecs.md).")
]
ConsensusStep = Annotated[float, typer.Option(help="CHOCO-SGD consensus step size γ in (0, 1].")]
KeyframeGrowth = Annotated[
    float,
    typer.Option(help="Keyframe when the compression error is this many times normal (0: off)."),
]
DenseBelow = Annotated[
    int, typer.Option(help="Send tensors with fewer elements uncompressed (0: none).")
]
ByteBudget = Annotated[
    int, typer.Option(help="Payload bytes per message; sets top-k/random-k density (0: off).")
]
LocalMomentum = Annotated[
    float,
    typer.Option(help="Heavy-ball momentum β in [0, 1) of the local SGD, kept across rounds."),
]
Rounds = Annotated[int, typer.Option(help="Gossip rounds.")]
LearningRate = Annotated[float, typer.Option(help="SGD learning rate.")]
BatchSize = Annotated[int, typer.Option(help="Minibatch size.")]
LocalEpochs = Annotated[int, typer.Option(help="Local epochs per round.")]
Deadline = Annotated[float, typer.Option(help="Round deadline in seconds.")]

# Topology, round and planning options (issue 4).
TopologyDegree = Annotated[
    int, typer.Option("--degree", help="random-regular degree, small-world lattice degree k.")
]
TopologyProbability = Annotated[
    float,
    typer.Option("--probability", help="erdos-renyi edge / small-world rewiring probability."),
]
TopologySeed = Annotated[
    int | None,
    typer.Option("--topology-seed", help="Seed of the random topologies (default: --seed)."),
]
Mixing = Annotated[
    str, typer.Option("--mixing", help="Mixing weights: metropolis-hastings or max-degree.")
]
Mode = Annotated[
    str,
    typer.Option("--mode", help="sync (rounds wait for the quorum) or async (bounded staleness)."),
]
Staleness = Annotated[
    int, typer.Option("--staleness", help="async: oldest usable neighbour lag τ, in rounds.")
]
Quorum = Annotated[
    float,
    typer.Option("--quorum", help="sync: proceed once this share of the neighbours answered."),
]
Plan = Annotated[
    bool, typer.Option("--plan/--no-plan", help="Capability-aware planning of work and codecs.")
]
UplinkBudget = Annotated[
    float,
    typer.Option(
        "--uplink-budget", help="Planner: seconds of uplink per message (sets byte budgets)."
    ),
]
MinBattery = Annotated[
    float,
    typer.Option(
        "--min-battery", help="Devices below this battery % (not charging) sit out; 0: off."
    ),
]
Elastic = Annotated[
    bool, typer.Option("--elastic/--no-elastic", help="Admit idle devices that appear mid-job.")
]

# Privacy and robustness (issue 5; docs/privacy.md).
SecureAggregation = Annotated[
    int,
    typer.Option(
        "--secure-aggregation",
        metavar="T",
        help="Secure aggregation in every neighbourhood with threshold T (0: off).",
    ),
]
SecureRange = Annotated[
    float,
    typer.Option("--secure-range", help="Fixed-point range ±R of a masked coordinate."),
]
DpNoiseMultiplier = Annotated[
    float, typer.Option("--dp-noise-multiplier", help="DP noise multiplier σ (0: no DP).")
]
DpClip = Annotated[float, typer.Option("--dp-clip", help="DP clipping norm C of each delta.")]
DpEpsilonBudget = Annotated[
    float,
    typer.Option("--dp-epsilon-budget", help="ε budget per device over all its jobs (0: none)."),
]
DpDelta = Annotated[float, typer.Option("--dp-delta", help="δ of the (ε, δ) guarantee.")]
DpMode = Annotated[
    str,
    typer.Option(
        "--dp-mode", help="local (each device adds all its noise) or distributed (needs SecAgg)."
    ),
]
Robust = Annotated[
    str | None,
    typer.Option(
        "--robust", help="Robust mixing: median, trimmed:0.1 or clipped-gossip (default: off)."
    ),
]


def privacy_fields(
    secure_aggregation: int,
    secure_range: float,
    dp_noise_multiplier: float,
    dp_clip: float,
    dp_mode: str,
    dp_delta: float,
    dp_epsilon_budget: float,
    robust: str | None,
) -> dict[str, object]:
    """The job-spec fields of the privacy options that are not at their defaults."""
    from meshfl.aggregation.privacy import DEFAULT_DP_DELTA, DEFAULT_SECURE_RANGE

    fields: dict[str, object] = {}
    if secure_aggregation:
        fields["secure_aggregation"] = secure_aggregation
    if secure_range != DEFAULT_SECURE_RANGE:
        fields["secure_range"] = secure_range
    if dp_noise_multiplier:
        fields["dp_noise_multiplier"] = dp_noise_multiplier
    if dp_clip:
        fields["dp_clip"] = dp_clip
    if dp_mode != "local":
        fields["dp_mode"] = dp_mode
    if dp_delta != DEFAULT_DP_DELTA:
        fields["dp_delta"] = dp_delta
    if dp_epsilon_budget:
        fields["dp_epsilon_budget"] = dp_epsilon_budget
    if robust:
        fields["robust"] = robust
    return fields


SECURE_DEFAULT_CODEC = "int8"
"""The codec a secure job uses when the codec option was left at its default (sign,
which cannot be masked)."""


def privacy_defaults(
    secure: bool, dp: bool, codec: str, keyframe_growth: float
) -> tuple[str, float, str]:
    """Swap the defaults that cannot work with secure aggregation or DP; say what changed.

    With ``--secure-aggregation``, a codec left at the default (sign) becomes int8; with
    it or with DP, keyframes left at the default turn off (a keyframe is an unmasked
    model). Options the user gave explicitly are kept (and refused with the reason if they
    cannot work). Returns ``(codec, keyframe_growth, note)``; the note is ``""`` when
    nothing changed.
    """
    from meshfl.app.local.config import DEFAULTS
    from meshfl.codecs import parse_codec

    changed = []
    if secure and parse_codec(codec).spec == parse_codec(DEFAULTS.codec).spec:
        codec = SECURE_DEFAULT_CODEC
        changed.append(f"codec {codec} ({DEFAULTS.codec} cannot be masked)")
    if (secure or dp) and keyframe_growth == DEFAULTS.keyframe_growth:
        keyframe_growth = 0.0
        changed.append("error-triggered keyframes off")
    what = "secure aggregation" if secure else "differential privacy"
    note = f"{what}: {', '.join(changed)}" if changed else ""
    return codec, keyframe_growth, note
