"""Checks on a ``JobSpec`` beyond its JSON types (pydantic checks those first)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from coordinator.planning import custom_graph
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.codecs import parse_codec
from meshfl.contract import (
    JOB_MODES,
    JOB_TOPOLOGIES,
    CapabilityProfile,
    DeviceDone,
    DeviceSelector,
    JobSpec,
    RoundMetrics,
    TopologySetting,
    spec_value,
)
from meshfl.errors import CodecSpecError, ConfigError, TopologyError
from meshfl.modelspec import ZOO_MODELS, check_sizes, with_hash
from meshfl.topology import MIXING_RULES, Graph, build_graph

MAX_SPEC_TEXT = 1024
"""Longest job name or ``test_data`` path accepted, characters."""

__all__ = [
    "LOSSLESS_CODECS",
    "MAX_LABELS",
    "MAX_LABEL_VALUE",
    "MAX_SECURE_KEYS",
    "MAX_SECURE_ROUNDS",
    "MAX_SPEC_TEXT",
    "MAX_TAGS",
    "TAG_PATTERN",
    "fill_model_hash",
    "validate_done",
    "validate_labels",
    "validate_metrics",
    "validate_missing",
    "validate_name",
    "validate_profile",
    "validate_selector",
    "validate_spec",
    "validate_tags",
    "validate_topology_setting",
]

#: Codec specs D-PSGD accepts: it averages models, so it needs them uncompressed.
LOSSLESS_CODECS = frozenset({"identity", "fp32"})

#: Models the agents build: the zoo's, and ``custom`` (a factory; the spec carries its hash).
KNOWN_MODELS = (*ZOO_MODELS, "custom")
MAX_ROUNDS = 100_000
MAX_SECURE_KEYS = 20_000
"""Most masking keys in one key bundle (rounds × the device's degree, 32 bytes each): it
must fit a request body (1 MiB). A secure job's rounds are capped by it at creation and
rounds × degree at the start."""
MAX_SECURE_ROUNDS = MAX_SECURE_KEYS

# (field, predicate, what it must be); the first failing rule is reported.
_RULES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("rounds", lambda v: 1 <= v <= MAX_ROUNDS, f"an integer in [1, {MAX_ROUNDS}]"),
    ("learning_rate", lambda v: 0 < v <= 1e3, "a number in (0, 1000]"),
    ("batch_size", lambda v: 1 <= v <= 2**20, "an integer in [1, 2^20]"),
    ("local_epochs", lambda v: 1 <= v <= 10_000, "an integer in [1, 10000]"),
    ("consensus_step", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("round_deadline_s", lambda v: 0.01 <= v <= 86_400, "seconds in [0.01, 86400]"),
    ("max_payload_bytes", lambda v: 1024 <= v <= 256 * 2**20, "bytes in [1024, 256 MiB]"),
    ("devices", lambda v: 0 <= v <= 1_000_000, "an integer >= 0 (0: all enrolled devices)"),
    ("sketch_dim", lambda v: 0 <= v <= 4096, "an integer in [0, 4096] (0: no sketch)"),
    ("seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)"),
)

# Optional fields (issue 4): (field, integer?, predicate, what it must be); the first
# three are the topology parameters the fleet setting shares.
_OptionalRule = tuple[str, bool, Callable[[float], bool], str]
_OPTIONAL_RULES: tuple[_OptionalRule, ...] = (
    ("topology_degree", True, lambda v: 1 <= v <= 1024, "an integer in [1, 1024]"),
    ("topology_probability", False, lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
    ("topology_seed", True, lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)"),
    ("staleness", True, lambda v: 0 <= v <= 1000, "an integer in [0, 1000] (rounds)"),
    ("quorum", False, lambda v: 0 < v <= 1, "a fraction in (0, 1] of the neighbours"),
    ("uplink_budget_s", False, lambda v: 0 < v <= 60, "seconds in (0, 60]"),
    ("min_battery_percent", False, lambda v: 0 <= v <= 100, "a percentage in [0, 100] (0: off)"),
)

_SELECTOR_RULES: tuple[_OptionalRule, ...] = (
    ("min_cores", True, lambda v: 0 <= v <= 1_000_000, "an integer in [0, 1000000]"),
    ("min_memory_bytes", True, lambda v: 0 <= v <= 2**53, "an integer of bytes in [0, 2^53]"),
    ("min_train_samples_per_s", False, lambda v: 0 <= v <= 1e12, "a number in [0, 1e12]"),
    ("min_uplink_bytes_per_s", False, lambda v: 0 <= v <= 1e15, "bytes/s in [0, 1e15]"),
)

CHECKED_GRAPH_SIZE = 256
"""Up to this many devices, a job's graph is built once at creation to refuse bad parameters."""


def validate_spec(spec: JobSpec) -> None:
    """Refuse a job spec that no device could run.

    Parameters
    ----------
    spec : JobSpec
        A spec whose field types pydantic has already checked.

    Raises
    ------
    meshfl.errors.ConfigError
        With a one-line message naming the field, its value and what it must be: a
        bound violated (``rounds >= 1``, ``0 < consensus_step <= 1``,
        ``max_payload_bytes >= 1024`` …), an algorithm other than ``choco``/``dpsgd``,
        a codec spec that does not parse, an unknown topology, ``dpsgd`` with a lossy
        codec, or privacy options that cannot work
        (:meth:`meshfl.aggregation.privacy.PrivacyOptions.from_spec`'s reason).

    """
    if not spec["name"].strip():
        raise ConfigError("spec.name is empty; give the job a name")
    for field in ("name", "test_data"):
        text = spec.get(field)
        if isinstance(text, str) and (len(text) > MAX_SPEC_TEXT or not text.isprintable()):
            raise ConfigError(
                f"spec.{field} must be printable text of at most {MAX_SPEC_TEXT} characters"
                " (no control characters)"
            )
    if "topology" not in spec:
        raise ConfigError("spec.topology is missing; name a topology (or create the job over"
                          " REST, which fills the fleet default)")  # fmt: skip
    for field, ok, must_be in _RULES:
        value = spec[field]  # type: ignore[literal-required]
        if isinstance(value, bool) or not math.isfinite(value) or not ok(value):
            raise ConfigError(f"spec.{field} = {value!r} is invalid; it must be {must_be}")
    growth = spec_value(spec, "keyframe_growth")
    if isinstance(growth, bool) or not (math.isfinite(growth) and (growth == 0 or growth > 1)):
        raise ConfigError(f"spec.keyframe_growth = {growth!r} must be 0 (off) or a number > 1")
    beta = spec_value(spec, "local_momentum")
    if isinstance(beta, bool) or not (math.isfinite(beta) and 0 <= beta < 1):
        raise ConfigError(f"spec.local_momentum = {beta!r} must be a number in [0, 1) (0: off)")
    if beta == 0 and spec_value(spec, "momentum_kind") == "quasi-global":
        raise ConfigError("spec.momentum_kind quasi-global needs spec.local_momentum > 0 (its β)")
    for field in ("dense_below", "byte_budget"):
        value = spec.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31:
            raise ConfigError(f"spec.{field} = {value!r} must be an integer in [0, 2^31]")
    model = spec["model"]
    if model["name"] not in KNOWN_MODELS:
        raise ConfigError(
            f"spec.model.name = {model['name']!r} is unknown; known: {', '.join(KNOWN_MODELS)}"
        )
    try:
        check_sizes(model)
    except ConfigError as exc:
        raise ConfigError(f"spec.model is invalid: {exc}") from None
    fill_model_hash(spec)
    if spec["algorithm"] not in ("choco", "dpsgd"):
        raise ConfigError(f"spec.algorithm = {spec['algorithm']!r}; use 'choco' or 'dpsgd'")
    try:
        parse_codec(spec["codec"])
    except CodecSpecError as exc:
        raise ConfigError(f"spec.codec = {spec['codec']!r} is invalid: {exc}") from exc
    if spec.get("byte_budget") and parse_codec(spec["codec"]).name not in ("topk", "randk"):
        raise ConfigError(
            f"spec.byte_budget sets a sparsifier's density but spec.codec = {spec['codec']!r};"
            " use topk:D or randk:D"
        )
    graph = _validate_topology(spec)
    if "select" in spec:
        validate_selector(spec["select"])
    if spec["algorithm"] == "dpsgd" and spec["codec"].strip().lower() not in LOSSLESS_CODECS:
        raise ConfigError(
            f"algorithm 'dpsgd' averages uncompressed models but spec.codec = "
            f"{spec['codec']!r}; use codec 'identity' (or 'fp32'), or algorithm 'choco'"
        )
    options = PrivacyOptions.from_spec(spec)
    options.check_release(spec)  # no un-noised model from a private job
    if options.secure and spec["rounds"] > MAX_SECURE_ROUNDS:
        raise ConfigError(
            f"spec.rounds = {spec['rounds']} is too many for secure aggregation (one masking"
            f" key per round in each key bundle); use at most {MAX_SECURE_ROUNDS} per job"
        )
    if options.secure and graph is not None:  # the graph is known now: t in (d/2, d]
        options.check_degrees({f"#{k}": graph.degree(k) for k in range(graph.n)}, spec["codec"])


def fill_model_hash(spec: JobSpec) -> JobSpec:
    """Return ``spec`` with ``model.hash`` filled: the zoo layout's hash, or the custom one.

    The hash is :func:`meshfl.modelspec.layout_hash` of :func:`meshfl.modelspec.layout`
    (computed without torch); agents that build a different layout decline the job.

    Raises
    ------
    meshfl.errors.ConfigError
        A bad ``image_shape``/``factory``/``kwargs``/``hash``, a zoo model's size rule
        (e.g. lenet's four widths), a custom model without ``hash``, or a zoo spec whose
        given ``hash`` is not its layout's.

    """
    try:
        model = with_hash(spec["model"])
    except ConfigError as exc:
        raise ConfigError(f"spec.model is invalid: {exc}") from None
    return {**spec, "model": model}


def _check_fields(doc: Mapping[str, Any], rules: Sequence[_OptionalRule], prefix: str) -> None:
    for field, integer, ok, must_be in rules:
        if field not in doc:
            continue
        value = doc[field]
        bad = isinstance(value, bool) or not isinstance(value, int | float)
        bad = bad or (integer and not isinstance(value, int))
        if bad or not math.isfinite(value) or not ok(value):
            raise ConfigError(f"{prefix}{field} = {value!r} is invalid; it must be {must_be}")


def _check_kind(doc: Mapping[str, Any], prefix: str) -> str:
    """The topology fields shared by a job spec and the fleet setting; returns the kind."""
    _check_fields(doc, _OPTIONAL_RULES[:3], prefix)
    mixing = spec_value(doc, "mixing")
    if mixing not in MIXING_RULES:
        raise ConfigError(f"{prefix}mixing = {mixing!r}; use one of {', '.join(MIXING_RULES)}")
    kind = doc.get("topology")
    if kind not in JOB_TOPOLOGIES:
        raise ConfigError(
            f"{prefix}topology = {kind!r} is not available to jobs; use one of"
            f" {', '.join(JOB_TOPOLOGIES)}"
        )
    if kind != "custom" and "custom_graph" in doc:
        raise ConfigError(
            f"{prefix}custom_graph is given but {prefix}topology = {kind!r}; set topology"
            " 'custom' or drop custom_graph"
        )
    return str(kind)


def validate_topology_setting(setting: TopologySetting) -> None:
    """Refuse a fleet topology setting (``PUT /topology``) no job could use.

    The same names and bounds as a job spec's topology fields: ``topology`` one of
    :data:`~meshfl.contract.JOB_TOPOLOGIES`, ``topology_degree`` in [1, 1024],
    ``topology_probability`` in [0, 1], ``topology_seed`` in [0, 2^32), ``mixing`` a
    known rule, ``custom_graph`` valid and given exactly when the kind is ``custom``.

    Raises
    ------
    meshfl.errors.ConfigError
        Naming the first bad field.

    """
    if _check_kind(setting, "") == "custom":
        _checked_custom(setting, "")


def validate_selector(selector: DeviceSelector) -> None:
    """Refuse a device selector (``JobSpec.select``) with impossible values.

    ``tags``: at most :data:`MAX_TAGS`, each :data:`TAG_PATTERN`; ``min_cores``,
    ``min_memory_bytes`` integers >= 0; ``min_train_samples_per_s``,
    ``min_uplink_bytes_per_s`` finite numbers >= 0.

    Raises
    ------
    meshfl.errors.ConfigError
        Naming the first bad field.

    """
    validate_tags(list(selector.get("tags", [])), "spec.select.tags")
    _check_fields(selector, _SELECTOR_RULES, "spec.select.")


def _validate_topology(spec: JobSpec) -> Graph | None:
    """The topology, its parameters, rounds, planning and churn fields (issue 4).

    Returns the graph when ``spec.devices`` (or a custom graph) fixes it, else ``None``.
    """
    _check_fields(spec, _OPTIONAL_RULES, "spec.")
    mode = spec_value(spec, "mode")
    if mode not in JOB_MODES:
        raise ConfigError(f"spec.mode = {mode!r}; use one of {', '.join(JOB_MODES)}")
    kind = _check_kind(spec, "spec.")
    if kind == "custom":
        return _validate_custom(spec)
    n = spec["devices"]
    if not 0 < n <= CHECKED_GRAPH_SIZE:
        return None
    try:
        graph = build_graph(
            kind,
            n,
            degree=spec_value(spec, "topology_degree"),
            probability=spec_value(spec, "topology_probability"),
            seed=spec.get("topology_seed", spec["seed"]),
        )
    except (ConfigError, TopologyError) as exc:
        raise ConfigError(f"spec.topology = {kind!r} is invalid for {n} devices: {exc}") from exc
    if not graph.is_connected() and kind != "one-peer-exponential":
        raise ConfigError(
            f"spec.topology = {kind!r} gives a disconnected graph on {n} devices; raise"
            " spec.topology_degree or spec.topology_probability"
        )
    return graph


def _checked_custom(doc: JobSpec | TopologySetting, prefix: str) -> Graph:
    if "custom_graph" not in doc:
        raise ConfigError(
            f"{prefix}topology = 'custom' needs {prefix}custom_graph"
            ' {"n": N, "edges": [[i, j], ...]} (the CLI reads it from --topology FILE.json)'
        )
    try:
        return custom_graph(doc)  # type: ignore[arg-type]  # reads only custom_graph
    except (ConfigError, TopologyError) as exc:
        raise ConfigError(f"{prefix}custom_graph is invalid: {exc}") from exc


def _validate_custom(spec: JobSpec) -> Graph:
    graph = _checked_custom(spec, "spec.")
    if spec["devices"] not in (0, graph.n):
        raise ConfigError(
            f"spec.custom_graph has {graph.n} nodes but spec.devices = {spec['devices']};"
            f" set devices to {graph.n} (or 0)"
        )
    return graph


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_MAX_COUNT = 2**53  # bytes and counts above this are not plausible (and lose float precision)


def validate_name(name: str) -> None:
    """A device name is 1-64 characters of ``[A-Za-z0-9_.-]`` (it appears in topics and logs)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"device name {name[:80]!r} is invalid; use 1-64 letters, digits, '_', '.' or '-'"
        )


def _number(field: str, value: float, low: float, high: float) -> None:
    try:
        ok = not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{field} = {shown} is invalid; it must be in [{low:g}, {high:g}]")


def validate_metrics(metrics: RoundMetrics, spec: JobSpec) -> None:
    """Refuse a round report with impossible values (accuracy outside [0, 1], NaN, ...)."""
    _number("accuracy", metrics["accuracy"], 0.0, 1.0)
    _number("loss", metrics["loss"], 0.0, 1e12)
    _number("bytes_sent", metrics["bytes_sent"], 0, _MAX_COUNT)
    _number("bytes_received", metrics["bytes_received"], 0, _MAX_COUNT)
    _number("train_s", metrics["train_s"], 0.0, 1e7)
    _number("round_s", metrics["round_s"], 0.0, 1e7)
    sketch = metrics["sketch"]
    if sketch and PrivacyOptions.from_spec(spec).private:
        raise ConfigError(
            "a round report of a private job (DP or secure aggregation) must carry no sketch:"
            " it is an un-noised projection of the device's model; send an empty sketch"
        )
    if sketch and len(sketch) != spec["sketch_dim"]:
        raise ConfigError(
            f"sketch has {len(sketch)} entries but the job's sketch_dim is {spec['sketch_dim']}"
        )
    if not bool((np.abs(np.asarray(sketch, dtype=np.float64)) < 1e30).all()):  # NaN: False
        raise ConfigError("sketch holds non-finite or absurd values")
    ledger = metrics.get("ledger")
    if ledger is not None:
        for field, value in cast(Mapping[str, int], ledger).items():  # every one an int
            if field != "peers":
                _number(f"ledger.{field}", value, 0, _MAX_COUNT)
        peers = cast(Mapping[str, Mapping[str, int]], ledger.get("peers") or {})
        if len(peers) > 100_000:
            raise ConfigError("ledger.peers lists more senders than any device has")
        for sender, counts in peers.items():
            for field, value in counts.items():  # discarded < 0 would be an agent's bug: shown
                low = -_MAX_COUNT if field == "discarded" else 0
                _number(f"ledger.peers.{sender[:64]}.{field}", value, low, _MAX_COUNT)


def validate_missing(missing: list[str], device_id: str, participants: set[str]) -> None:
    """Refuse a report's ``missing`` unless it names other participants of the job, once each.

    A neighbour of any topology version is a participant (a row of ``job_devices``, kept
    after it leaves), so an honest device's list always passes; raises ``ConfigError``
    naming the first entry that is not one.
    """
    if len(set(missing)) != len(missing):
        raise ConfigError("missing names a neighbour twice; list each one at most once")
    for entry in missing:
        if entry == device_id or entry not in participants:
            raise ConfigError(
                f"missing names {str(entry)[:80]!r}, which is not another participant of"
                " this job; list only the neighbours whose delta did not arrive"
            )


def validate_done(done: DeviceDone) -> None:
    """Refuse a done report with impossible values."""
    _number("final_accuracy", done["final_accuracy"], 0.0, 1.0)
    _number("bytes_sent", done["bytes_sent"], 0, _MAX_COUNT)
    _number("bytes_received", done["bytes_received"], 0, _MAX_COUNT)
    diff = done.get("onnx_max_abs_diff")
    if diff is not None:
        _number("onnx_max_abs_diff", diff, 0.0, 1e30)


# Numeric profile fields and their upper bound (all must be finite and >= 0).
_PROFILE_NUMBERS: tuple[tuple[str, float], ...] = (
    ("cores", 1_000_000),
    ("memory_bytes", _MAX_COUNT),
    ("train_samples_per_s", 1e12),
    ("train_samples", _MAX_COUNT),
    ("uplink_bytes_per_s", 1e15),
    ("downlink_bytes_per_s", 1e15),
    ("broker_rtt_s", 86_400),
    ("battery_percent", 100),
    ("measured_at", 1e11),
)


def validate_profile(profile: CapabilityProfile) -> None:
    """Refuse a capability profile with impossible numbers.

    Every number present must be finite and non-negative (``battery_percent`` at most
    100); ``None`` is accepted where the contract allows it (no battery). Raises
    :class:`meshfl.errors.ConfigError` naming the first bad field.
    """
    for field, high in _PROFILE_NUMBERS:
        value = profile.get(field)
        if value is not None:
            _number(f"profile.{field}", value, 0, high)  # type: ignore[arg-type]
    for field in ("platform", "model_hash", "accelerator"):
        text = profile.get(field)
        if isinstance(text, str) and (
            len(text) > 256 or any(ord(c) < 32 or ord(c) == 127 for c in text)
        ):
            raise ConfigError(
                f"profile.{field} is invalid; at most 256 printable characters, got {text[:40]!r}"
            )
    role = profile.get("role")
    if role is not None and role not in ("train", "inference"):
        raise ConfigError(f"profile.role must be 'train' or 'inference', got {str(role)[:40]!r}")


TAG_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What a device tag or label key is: 1-64 of ``[A-Za-z0-9_.:-]``."""
MAX_TAGS = 32
MAX_LABELS = 32
MAX_LABEL_VALUE = 256


def validate_tags(tags: list[str], what: str = "tags") -> list[str]:
    """Return ``tags`` without repeats (first kept); refuse a bad tag or too many.

    Each tag matches :data:`TAG_PATTERN`; at most :data:`MAX_TAGS` distinct tags.
    ``what`` names the field in the message. Raises :class:`meshfl.errors.ConfigError`.
    """
    for tag in tags:
        if not TAG_PATTERN.fullmatch(tag):
            raise ConfigError(
                f"{what}: tag {tag[:80]!r} is invalid; use 1-64 letters, digits, '_', '.',"
                " ':' or '-'"
            )
    unique = list(dict.fromkeys(tags))
    if len(unique) > MAX_TAGS:
        raise ConfigError(f"{what}: {len(unique)} tags given, at most {MAX_TAGS} are allowed")
    return unique


def validate_labels(labels: dict[str, str]) -> None:
    """Refuse a bad label key or value, or too many labels.

    Keys match :data:`TAG_PATTERN`; values are at most :data:`MAX_LABEL_VALUE` printable
    characters; at most :data:`MAX_LABELS` labels. Raises
    :class:`meshfl.errors.ConfigError`.
    """
    if len(labels) > MAX_LABELS:
        raise ConfigError(f"labels: {len(labels)} given, at most {MAX_LABELS} are allowed")
    for key, value in labels.items():
        if not TAG_PATTERN.fullmatch(key):
            raise ConfigError(
                f"labels: key {key[:80]!r} is invalid; use 1-64 letters, digits, '_', '.',"
                " ':' or '-'"
            )
        if len(value) > MAX_LABEL_VALUE or not value.isprintable():  # no controls, surrogates
            raise ConfigError(
                f"labels: the value of {key!r} is invalid; at most {MAX_LABEL_VALUE} printable"
                " characters"
            )
