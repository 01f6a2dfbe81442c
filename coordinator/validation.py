"""Checks on a ``JobSpec`` beyond its JSON types (pydantic checks those first)."""

from __future__ import annotations

from collections.abc import Callable

from meshfl.codecs import parse_codec
from meshfl.contract import JobSpec
from meshfl.errors import CodecSpecError, ConfigError
from meshfl.topology import build_graph

__all__ = ["LOSSLESS_CODECS", "validate_spec"]

#: Codec specs D-PSGD accepts: it averages models, so it needs them uncompressed.
LOSSLESS_CODECS = frozenset({"identity", "fp32"})

# (field, predicate, what it must be); the first failing rule is reported.
_RULES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("rounds", lambda v: v >= 1, "an integer >= 1"),
    ("learning_rate", lambda v: v > 0, "a number > 0"),
    ("batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("local_epochs", lambda v: v >= 1, "an integer >= 1"),
    ("consensus_step", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("round_deadline_s", lambda v: v > 0, "a number of seconds > 0"),
    ("max_payload_bytes", lambda v: v >= 1024, "an integer >= 1024 (bytes)"),
    ("devices", lambda v: v >= 0, "an integer >= 0 (0: all enrolled devices)"),
    ("sketch_dim", lambda v: v >= 0, "an integer >= 0 (0: no sketch)"),
)


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
        a codec spec that does not parse, an unknown topology, or ``dpsgd`` with a lossy
        codec.

    """
    if not spec["name"].strip():
        raise ConfigError("spec.name is empty; give the job a name")
    for field, ok, must_be in _RULES:
        value = spec[field]  # type: ignore[literal-required]
        if not ok(value):
            raise ConfigError(f"spec.{field} = {value!r} is invalid; it must be {must_be}")
    model = spec["model"]
    if model["input_dim"] < 1 or model["num_classes"] < 2 or any(h < 1 for h in model["hidden"]):
        raise ConfigError(
            "spec.model is invalid; input_dim must be >= 1, num_classes >= 2 "
            "and every hidden layer width >= 1"
        )
    if spec["algorithm"] not in ("choco", "dpsgd"):
        raise ConfigError(f"spec.algorithm = {spec['algorithm']!r}; use 'choco' or 'dpsgd'")
    try:
        parse_codec(spec["codec"])
    except CodecSpecError as exc:
        raise ConfigError(f"spec.codec = {spec['codec']!r} is invalid: {exc}") from exc
    try:
        build_graph(spec["topology"], 4)
    except ConfigError as exc:
        raise ConfigError(f"spec.topology = {spec['topology']!r} is invalid: {exc}") from exc
    if spec["algorithm"] == "dpsgd" and spec["codec"].strip().lower() not in LOSSLESS_CODECS:
        raise ConfigError(
            f"algorithm 'dpsgd' averages uncompressed models but spec.codec = "
            f"{spec['codec']!r}; use codec 'identity' (or 'fp32'), or algorithm 'choco'"
        )
