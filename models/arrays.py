"""``state_dict`` ⇄ ordered numpy arrays, and a model's identity hash.

The arrays are what the kernel (codecs, wire, aggregation) works on: an ordered
``dict[str, np.ndarray]`` keyed by ``state_dict`` names, float32 for floating tensors.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from meshfl.errors import ConfigError
from meshfl.modelspec import layout_hash

__all__ = ["load_arrays", "spec_hash", "to_arrays"]


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    data = tensor.detach().cpu()
    if data.is_floating_point():
        data = data.to(torch.float32)
    return np.array(data.numpy(), copy=True)


def to_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """Copy a module's ``state_dict`` into numpy arrays.

    Parameters
    ----------
    module : torch.nn.Module
        Any module; its parameters and buffers are read, never modified.

    Returns
    -------
    dict[str, numpy.ndarray]
        One array per ``state_dict`` entry, in ``state_dict`` order, with the tensor's
        shape. Floating tensors are copied as float32; other tensors keep their dtype.
        The arrays own their memory (changing them does not change the module).

    """
    return {name: _as_numpy(tensor) for name, tensor in module.state_dict().items()}


def load_arrays(module: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Overwrite a module's ``state_dict`` with ``arrays``, in place.

    Parameters
    ----------
    module : torch.nn.Module
        The module to update.
    arrays : Mapping[str, numpy.ndarray]
        Exactly the module's ``state_dict`` names, each with exactly the tensor's shape.
        Values are cast to the tensor's dtype (float32 for W1's MLP) and copied.

    Raises
    ------
    ConfigError
        A missing or unexpected name, or a shape mismatch; the message names the tensor.
        The module is left unchanged when this is raised.

    """
    state = module.state_dict()
    missing = [name for name in state if name not in arrays]
    if missing:
        raise ConfigError(f"model parameter {missing[0]!r} is missing from the arrays")
    unexpected = [name for name in arrays if name not in state]
    if unexpected:
        raise ConfigError(f"array {unexpected[0]!r} is not a parameter of this model")
    for name, tensor in state.items():
        shape = tuple(np.shape(arrays[name]))
        if shape != tuple(tensor.shape):
            raise ConfigError(
                f"array {name!r} has shape {shape} but the model's tensor has shape "
                f"{tuple(tensor.shape)}"
            )
    with torch.no_grad():
        for name, tensor in state.items():
            # ascontiguousarray makes a 0-d array 1-d (BatchNorm's num_batches_tracked)
            value = np.ascontiguousarray(arrays[name]).reshape(tuple(tensor.shape))
            tensor.copy_(torch.from_numpy(value).to(tensor.dtype))


def spec_hash(model: nn.Module | Mapping[str, np.ndarray]) -> str:
    """Identity of a model's layout: sha256 over tensor names, shapes and dtypes, in order.

    The one definition is :func:`meshfl.modelspec.layout_hash`, which the coordinator uses
    on :func:`meshfl.modelspec.layout` (no torch): for a zoo spec,
    ``spec_hash(build_model(spec, seed)) == layout_hash(layout(spec))``.

    Weights do not enter the hash, so every device training the same spec has the same
    hash whatever its current parameters. ``spec_hash(module) == spec_hash(to_arrays(module))``.

    Parameters
    ----------
    model : torch.nn.Module or Mapping[str, numpy.ndarray]
        A module (its ``state_dict`` as :func:`to_arrays` would give it) or ordered arrays.

    Returns
    -------
    str
        64 lowercase hex digits.

    """
    if isinstance(model, nn.Module):
        layout = [
            (name, tuple(t.shape), "float32" if t.is_floating_point() else _as_numpy(t).dtype.name)
            for name, t in model.state_dict().items()
        ]
    else:
        layout = [(name, tuple(np.shape(a)), np.asarray(a).dtype.name) for name, a in model.items()]
    return layout_hash(layout)
