"""A spec's optional fields, its hash at job creation and on the device, CLI spec building.

``image_shape``, ``factory``, ``kwargs`` and ``hash`` are checked by
:func:`validate_model_spec`; the coordinator fills ``hash`` with :func:`with_hash`; an
agent compares what it built with :func:`check_hash`; the CLIs build specs with
:func:`from_options`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from meshfl.contract import MAX_CLASSES, ModelSpec
from meshfl.errors import ConfigError, SecurityError
from meshfl.modelspec.allow import refuse_standard_library
from meshfl.modelspec.layout import (
    DEFAULT_HIDDEN,
    image_shape,
    is_custom,
    layout,
    layout_hash,
)

__all__ = [
    "MAX_CLASSES",
    "MAX_HIDDEN_LAYERS",
    "MAX_WIDTH",
    "check_hash",
    "check_sizes",
    "describe",
    "from_options",
    "validate_model_spec",
    "with_hash",
]

MAX_WIDTH = 65_536
"""Largest ``input_dim`` and hidden width a job may have (the coordinator's and CLIs' bound)."""
MAX_HIDDEN_LAYERS = 64
"""Most entries ``hidden`` may have."""

_resolve_image_shape = image_shape  # for from_options, whose parameter has the same name

_FACTORY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_HASH = re.compile(r"[0-9a-f]{64}")
_MAX_KWARGS_BYTES = 16_384


def validate_model_spec(spec: Mapping[str, Any]) -> None:
    """Check the optional fields a zoo or custom spec may carry.

    ``image_shape`` (three positive ints, product ``input_dim``), ``factory``
    (``"package.module:callable"``; required by and only with ``name: "custom"``; never
    a standard-library or built-in module, :func:`~meshfl.modelspec.allow.refuse_standard_library`),
    ``kwargs`` (a JSON object of at most 16 KiB, only with a factory) and ``hash`` (64
    lowercase hex). Zoo-specific rules (e.g. lenet's four widths) are :func:`layout`'s.

    Raises
    ------
    ConfigError
        Naming the first bad field and the fix.

    """
    if "image_shape" in spec:
        image_shape(spec)
    factory = spec.get("factory")
    if spec.get("name") == "custom" and factory is None:
        raise ConfigError(
            "model 'custom' needs a factory 'package.module:callable' (CLI: --model"
            " package.module:callable)"
        )
    if factory is not None:
        if spec.get("name") != "custom":
            raise ConfigError(
                f"a model with a factory must be named 'custom', got {spec.get('name')!r}"
            )
        if not isinstance(factory, str) or not _FACTORY.fullmatch(factory):
            raise ConfigError(
                f"model factory {factory!r} must be 'package.module:callable' (dotted Python"
                " names), e.g. 'mypkg.nets:make_net'"
            )
        try:
            refuse_standard_library(factory)
        except SecurityError as exc:
            raise ConfigError(str(exc)) from None
    if "kwargs" in spec:
        kwargs = spec["kwargs"]
        if factory is None:
            raise ConfigError("model spec field 'kwargs' is given without a factory; drop it")
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(
                f"model spec field 'kwargs' must be a JSON object, got {kwargs!r}"[:200]
            )
        try:
            size = len(json.dumps(kwargs, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"model spec field 'kwargs' must hold JSON values only ({exc})"
            ) from None
        if size > _MAX_KWARGS_BYTES:
            raise ConfigError(
                f"model spec field 'kwargs' is {size} bytes of JSON; keep it under"
                f" {_MAX_KWARGS_BYTES}"
            )
    if "hash" in spec and not (isinstance(spec["hash"], str) and _HASH.fullmatch(spec["hash"])):
        raise ConfigError(
            f"model spec field 'hash' must be 64 lowercase hex digits (sha256), got"
            f" {str(spec['hash'])[:80]!r}; copy it from `meshfl model spec`"
        )


def check_sizes(spec: Mapping[str, Any]) -> None:
    """Refuse sizes no job may have: the one bound shared by the coordinator and the CLIs.

    ``input_dim`` and every ``hidden`` width in ``[1, MAX_WIDTH]`` (65 536), at most
    :data:`MAX_HIDDEN_LAYERS` (64) hidden entries, ``num_classes`` in
    ``[2, MAX_CLASSES]`` (:data:`meshfl.contract.MAX_CLASSES`, 100 000); every one an
    ``int`` (not a bool).

    Raises
    ------
    ConfigError
        Naming the first field out of bounds, its value and the bound.

    """
    bounds = (("input_dim", 1, MAX_WIDTH), ("num_classes", 2, MAX_CLASSES))
    for key, low, high in bounds:
        value = spec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(
                f"model {key} = {value!r} is out of range; it must be an integer in [{low}, {high}]"
            )
    widths = spec.get("hidden", [])
    if not isinstance(widths, list | tuple) or len(widths) > MAX_HIDDEN_LAYERS:
        raise ConfigError(
            f"model hidden must be a list of at most {MAX_HIDDEN_LAYERS} widths, got"
            f" {str(widths)[:80]}"
        )
    for width in widths:
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
            raise ConfigError(
                f"model hidden width {width!r} is out of range; each must be an integer in"
                f" [1, {MAX_WIDTH}]"
            )


def with_hash(spec: ModelSpec) -> ModelSpec:
    """Return a copy of a validated spec whose ``hash`` is filled (zoo) or checked present.

    Raises
    ------
    ConfigError
        A custom spec without ``hash``, or a zoo spec whose given ``hash`` is not the
        layout's (the zoo's layout for those fields is known here).

    """
    validate_model_spec(spec)
    if is_custom(spec):
        if "hash" not in spec:
            raise ConfigError(
                f"model spec field 'hash' is required for custom model {spec.get('factory')!r}"
                " (the coordinator cannot build it); print it with `meshfl model spec"
                " FACTORY --input-dim N --num-classes K` and add it to the spec"
            )
        return dict(spec)  # type: ignore[return-value]
    expected = layout_hash(layout(spec))
    if spec.get("hash", expected) != expected:
        raise ConfigError(
            f"model spec hash {spec['hash'][:12]}… does not match {describe(spec)}, whose"
            f" layout hashes to {expected[:12]}…; drop the hash field or fix the spec"
        )
    filled = dict(spec)
    filled["hash"] = expected
    return filled  # type: ignore[return-value]


def describe(spec: Mapping[str, Any]) -> str:
    """A one-line description of a spec for messages, e.g. ``lenet(64→10, hidden [..])``."""
    if is_custom(spec):
        kwargs = json.dumps(spec.get("kwargs", {}), sort_keys=True)[:120]
        head = f"custom {spec.get('factory')} kwargs {kwargs}"
    else:
        head = str(spec.get("name"))
    parts = [f"{spec.get('input_dim')}→{spec.get('num_classes')}"]
    if spec.get("hidden"):
        parts.append(f"hidden {list(spec['hidden'])}")
    if spec.get("image_shape"):
        parts.append(f"image_shape {list(spec['image_shape'])}")
    return f"{head} ({', '.join(parts)})"


def check_hash(spec: Mapping[str, Any], built: str) -> None:
    """Refuse a model built on this device whose layout hash is not the job's.

    Parameters
    ----------
    spec : ModelSpec
        The job's model spec; without ``hash`` nothing is checked.
    built : str
        :func:`layout_hash` of the model this device built from ``spec``.

    Raises
    ------
    ConfigError
        ``"model spec hash mismatch: job expects <12 hex>…, this device built <12 hex>…
        from <spec>; install the same model code (package version) on every device"``.

    """
    expected = spec.get("hash")
    if expected is None or expected == built:
        return
    raise ConfigError(
        f"model spec hash mismatch: job expects {str(expected)[:12]}…, this device built"
        f" {built[:12]}… from {describe(spec)}; install the same model code (package version)"
        " on every device"
    )


def from_options(
    model: str,
    input_dim: int,
    num_classes: int,
    hidden: list[int] | None = None,
    image_shape: list[int] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> ModelSpec:
    """Build a spec from command-line choices (``meshfl local``, ``job start``, ``model spec``).

    Parameters
    ----------
    model : str
        A zoo name (:data:`ZOO_MODELS`) or a factory ``"package.module:callable"``
        (a ``custom`` model).
    input_dim, num_classes : int
        Features per sample and classes.
    hidden : list of int, optional
        ``None``: the model's :data:`DEFAULT_HIDDEN`.
    image_shape : list of int, optional
        ``[C, H, W]``; ``None`` for ``lenet``/``resnet``: filled in explicitly from
        :func:`image_shape`'s square default (digits: ``[1, 8, 8]``).
    kwargs : dict, optional
        The factory's keyword arguments (custom models only).

    Raises
    ------
    ConfigError
        An unknown name, a malformed factory, kwargs without a factory, a size out of
        the bounds every job has (:func:`check_sizes`), or a size rule of the zoo model
        (:func:`layout`).

    """
    custom = ":" in model
    name = "custom" if custom else model
    spec: dict[str, Any] = {
        "name": name,
        "input_dim": input_dim,
        "num_classes": num_classes,
        "hidden": list(DEFAULT_HIDDEN.get(name, []) if hidden is None else hidden),
    }
    check_sizes(spec)
    if custom:
        spec["factory"] = model
    if kwargs is not None:
        spec["kwargs"] = kwargs
    if image_shape is not None:
        spec["image_shape"] = list(image_shape)
    elif name in ("lenet", "resnet"):
        spec["image_shape"] = list(_resolve_image_shape(spec))
    validate_model_spec(spec)
    if not custom:
        layout(spec)
    return spec  # type: ignore[return-value]
