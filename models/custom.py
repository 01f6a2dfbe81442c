"""User models by import path: ``{"name": "custom", "factory": "package.module:callable"}``.

The factory is imported with :mod:`importlib` from what is installed on this device (never
fetched from the network), called with the spec's ``kwargs`` — plus ``input_dim`` and
``num_classes`` from the spec when its signature takes them and ``kwargs`` does not set
them — and checked on a dummy batch. It is seeded deterministically: it runs under
``torch.random.fork_rng`` after ``torch.manual_seed(seed)``, so every device building the
same spec and seed gets the same weights (with the same torch version) and the caller's
global RNG is left untouched.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from meshfl.errors import ConfigError
from meshfl.modelspec import positive_int, validate_model_spec

__all__ = ["build_custom", "load_factory"]

_PROBE_ROWS = 2


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def load_factory(factory: str) -> Callable[..., Any]:
    """Import ``"package.module:callable"`` and return the callable.

    Raises
    ------
    ConfigError
        A malformed path, a module that is not installed or fails to import (or calls
        ``sys.exit``), a missing
        attribute, or an attribute that is not callable; one line naming the factory
        and the fix.

    """
    validate_model_spec({"name": "custom", "factory": factory})
    module_name, _, attribute = factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ConfigError(
                f"model factory {factory!r}: module {exc.name!r} is not installed on this"
                " device; install the package that provides it (or add its directory to"
                " PYTHONPATH)"
            ) from None
        raise ConfigError(
            f"model factory {factory!r}: importing {module_name!r} failed ({_short(exc)});"
            " install what it needs on this device"
        ) from None
    except (Exception, SystemExit) as exc:  # the user's module may raise anything
        raise ConfigError(
            f"model factory {factory!r}: importing {module_name!r} failed ({_short(exc)});"
            " fix the module"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(
                f"model factory {factory!r}: module {module_name!r} has no attribute"
                f" {attribute!r}; check the name after ':'"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(
            f"model factory {factory!r}: {attribute!r} is not callable (it is a"
            f" {type(target).__name__}); point it at a function or class that returns a"
            " torch.nn.Module"
        )
    return target  # type: ignore[no-any-return]


def _sizes(make: Callable[..., Any], input_dim: int, classes: int) -> dict[str, int]:
    """``input_dim`` and ``num_classes`` for a factory whose signature takes them."""
    try:
        params = inspect.signature(make).parameters
    except (TypeError, ValueError):  # no introspectable signature: pass nothing implicitly
        return {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    sizes = {"input_dim": input_dim, "num_classes": classes}
    return {k: v for k, v in sizes.items() if takes_any or k in params}


def build_custom(spec: Mapping[str, Any], seed: int) -> nn.Module:
    """Build and check a custom model from ``spec["factory"]`` and ``spec.get("kwargs")``.

    Parameters
    ----------
    spec : ModelSpec
        ``name: "custom"``, ``factory``, optional ``kwargs``, ``input_dim``, ``num_classes``.
    seed : int
        Seeds torch's global RNG inside ``torch.random.fork_rng`` while the factory runs.

    Returns
    -------
    torch.nn.Module
        A float32 module on the CPU in training mode mapping ``(n, input_dim)`` float32 to
        ``(n, num_classes)`` logits (checked on a zero batch of 2 rows in eval mode).

    Raises
    ------
    ConfigError
        Any of :func:`load_factory`'s errors; the call failing (e.g. bad ``kwargs``) or
        exiting (``SystemExit``; ``KeyboardInterrupt`` propagates); a result that is not
        an ``nn.Module`` or has no parameters; a forward pass that fails or has the wrong
        output shape.

    """
    validate_model_spec(spec)
    factory = str(spec.get("factory"))
    input_dim = positive_int(spec, "input_dim")
    classes = positive_int(spec, "num_classes")
    make = load_factory(factory)
    kwargs = {**_sizes(make, input_dim, classes), **dict(spec.get("kwargs") or {})}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = make(**kwargs)
        except (Exception, SystemExit) as exc:  # the user's code may raise anything
            raise ConfigError(
                f"model factory {factory!r} failed when called with kwargs {kwargs}"
                f" ({_short(exc)}); fix the model's kwargs"
            ) from None
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"model factory {factory!r} returned a {type(model).__name__}, not a"
                " torch.nn.Module; make it return the model"
            )
        if next(model.parameters(), None) is None:
            raise ConfigError(
                f"model factory {factory!r} returned a {type(model).__name__} that has no"
                " parameters to train; make it return a model with trainable layers"
            )
        model = model.to(device="cpu", dtype=torch.float32)
        model.eval()
        try:
            with torch.no_grad():
                out = model(torch.zeros(_PROBE_ROWS, input_dim))
        except (Exception, SystemExit) as exc:
            raise ConfigError(
                f"model factory {factory!r}: its model fails on a ({_PROBE_ROWS}, {input_dim})"
                f" float32 batch ({_short(exc)}); it must accept (n, input_dim) rows"
            ) from None
    model.train()
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (_PROBE_ROWS, classes):
        raise ConfigError(
            f"model factory {factory!r}: its model maps ({_PROBE_ROWS}, {input_dim}) to {shape},"
            f" expected ({_PROBE_ROWS}, {classes}); it must return num_classes logits per row"
        )
    return model
