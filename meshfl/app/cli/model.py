"""``meshfl model spec``: a model's layout and hash, and the model options of other commands."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from meshfl.contract import ModelSpec
from meshfl.errors import ConfigError

__all__ = [
    "HiddenOption",
    "ImageShapeOption",
    "ModelKwargsOption",
    "ModelOption",
    "model_app",
    "model_layout",
    "parse_hidden",
    "parse_image_shape",
    "parse_kwargs",
    "parse_model_options",
]

model_app = typer.Typer(help="Inspect models: layout, parameter count, spec hash.")

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        help="mlp, logreg, cnn1d, lenet, resnet, or a user model package.module:callable.",
    ),
]
ModelKwargsOption = Annotated[
    str | None,
    typer.Option("--model-kwargs", metavar="JSON", help="Keyword arguments of a user model."),
]
HiddenOption = Annotated[
    str | None,
    typer.Option(
        "--hidden", help="Widths, comma-separated ('' for none; default: the model's own)."
    ),
]
ImageShapeOption = Annotated[
    str | None,
    typer.Option(
        "--image-shape",
        metavar="C,H,W",
        help="How 2-D models read a sample (default: 1 channel, square).",
    ),
]


def parse_hidden(text: str | None) -> list[int] | None:
    """``"64,32"`` → ``[64, 32]``; ``""`` → ``[]``; ``None`` → ``None`` (model default)."""
    if text is None:
        return None
    try:
        return [int(h) for h in text.split(",") if h.strip()]
    except ValueError:
        raise ConfigError(f"--hidden {text!r}: give comma-separated integers, e.g. 64,32") from None


def parse_image_shape(text: str | None) -> list[int] | None:
    """``"1,8,8"`` → ``[1, 8, 8]``; ``None`` → ``None``."""
    if text is None:
        return None
    try:
        shape = [int(s) for s in text.split(",")]
    except ValueError:
        shape = []
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"--image-shape {text!r}: give three positive integers C,H,W, e.g. 1,8,8")
    return shape


def parse_kwargs(text: str | None, option: str = "--model-kwargs") -> dict[str, Any] | None:
    """``--model-kwargs`` (or ``option``) JSON text → a dict (``None`` → ``None``)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{option} is not valid JSON ({exc.msg} at character {exc.pos});"
            " give an object, e.g. '{\"width\": 32}'"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option} must be a JSON object, e.g. '{{\"width\": 32}}'")
    return value


def parse_model_options(
    model: str,
    input_dim: int,
    num_classes: int,
    hidden: str | None,
    image_shape: str | None,
    kwargs: str | None,
    kwargs_option: str = "--model-kwargs",
) -> ModelSpec:
    """The model spec of a command's model options, given as text.

    ``hidden``, ``image_shape`` and ``kwargs`` are the text of ``--hidden``,
    ``--image-shape`` and the keyword-arguments option named ``kwargs_option``.

    Raises
    ------
    ConfigError
        An option that does not parse, or a spec :func:`meshfl.modelspec.from_options`
        refuses.

    """
    from meshfl.modelspec import from_options

    return from_options(
        model,
        input_dim,
        num_classes,
        hidden=parse_hidden(hidden),
        image_shape=parse_image_shape(image_shape),
        kwargs=parse_kwargs(kwargs, kwargs_option),
    )


def model_layout(spec: ModelSpec) -> tuple[list[tuple[str, tuple[int, ...], str]], str]:
    """The spec's layout and hash: computed without torch for a zoo model, built for a custom.

    A custom model is built as an agent builds it (:func:`models.zoo.build_model`, seed 0),
    so the hash printed is the one agents compute.
    """
    from meshfl.modelspec import is_custom, layout, layout_hash

    if not is_custom(spec):
        entries = layout(spec)
        return entries, layout_hash(entries)
    from models.arrays import spec_hash, to_arrays
    from models.zoo import build_model

    arrays = to_arrays(build_model(spec, 0))
    entries = [(name, tuple(a.shape), a.dtype.name) for name, a in arrays.items()]
    return entries, spec_hash(arrays)


@model_app.command("spec")
def spec(
    model: Annotated[
        str,
        typer.Argument(
            metavar="NAME-OR-FACTORY",
            help="mlp, logreg, cnn1d, lenet, resnet, or package.module:callable.",
        ),
    ],
    input_dim: Annotated[int, typer.Option(help="Features per sample.")],
    num_classes: Annotated[int, typer.Option(help="Number of classes.")],
    kwargs: Annotated[
        str | None,
        typer.Option("--kwargs", metavar="JSON", help="Keyword arguments of a user model."),
    ] = None,
    hidden: HiddenOption = None,
    image_shape: ImageShapeOption = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='Print {"spec", "layout", "parameters", "hash"}.'),
    ] = False,
) -> None:
    """Print a model's tensors (names, shapes, dtypes), parameter count and spec hash.

    Zoo models need no torch. A user model is imported and built as an agent would:
    put the printed hash in the job's model spec ("hash") so that devices with other
    model code decline the job.
    """
    from meshfl.modelspec import describe, parameter_count

    spec_ = parse_model_options(
        model, input_dim, num_classes, hidden, image_shape, kwargs, "--kwargs"
    )
    entries, digest = model_layout(spec_)
    spec_["hash"] = digest
    count = parameter_count(entries)
    if not entries:  # build_custom refuses these; a last guard for the table below
        raise ConfigError(
            f"model {describe(spec_)} has no parameters to train; give it trainable layers"
        )
    if as_json:
        document = {
            "spec": spec_,
            "layout": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in entries],
            "parameters": count,
            "hash": digest,
        }
        typer.echo(json.dumps(document, indent=2))
        return
    width = max(len(n) for n, _, _ in entries)
    typer.echo(f"model {describe(spec_)}")
    for name, shape, dtype in entries:
        numel = parameter_count([(name, shape, dtype)])
        typer.echo(f"  {name:<{width}}  {shape!s:<18} {dtype:<8} {numel:>9,}")
    typer.echo(f"parameters: {count:,} ({len(entries)} tensors)")
    typer.echo(f"hash: {digest}")
