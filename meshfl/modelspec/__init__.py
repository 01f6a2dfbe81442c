"""A model's layout and identity hash from its spec alone (numpy + stdlib, no torch).

The coordinator knows a model only by its :class:`~meshfl.contract.ModelSpec`. For every
zoo model (:data:`ZOO_MODELS`), :func:`layout` computes the ``state_dict`` the agents'
``models.zoo.build_model`` will build — the same names, shapes and dtypes in the same
order — so the coordinator can fill ``model.hash`` (:func:`layout_hash`) at job creation
and an agent whose built model differs refuses the job (:func:`check_hash`). A custom
model (``factory``) has no layout here: its spec carries the hash that
``meshfl model spec`` prints.

- :mod:`meshfl.modelspec.layout`: layouts, the hash, shape rules shared with ``models``.
- :mod:`meshfl.modelspec.fields`: the optional spec fields, the size bounds every job
  has (:func:`check_sizes`), the hash checks at job creation and on the device, specs
  from CLI options.
- :mod:`meshfl.modelspec.allow`: what a device's owner allows a job — the factories it
  may call (never the standard library) and the data directory its paths stay in.
"""

from __future__ import annotations

from meshfl.modelspec.allow import (
    check_allow_list,
    check_allowed,
    confine_path,
    refuse_standard_library,
)
from meshfl.modelspec.fields import (
    MAX_CLASSES,
    MAX_HIDDEN_LAYERS,
    MAX_WIDTH,
    check_hash,
    check_sizes,
    describe,
    from_options,
    validate_model_spec,
    with_hash,
)
from meshfl.modelspec.layout import (
    DEFAULT_HIDDEN,
    ZOO_MODELS,
    Layout,
    cnn1d_lengths,
    group_count,
    hidden,
    image_shape,
    is_custom,
    layout,
    layout_hash,
    lenet_sizes,
    parameter_count,
    positive_int,
)

__all__ = [
    "DEFAULT_HIDDEN",
    "MAX_CLASSES",
    "MAX_HIDDEN_LAYERS",
    "MAX_WIDTH",
    "ZOO_MODELS",
    "Layout",
    "check_allow_list",
    "check_allowed",
    "check_hash",
    "check_sizes",
    "cnn1d_lengths",
    "confine_path",
    "describe",
    "from_options",
    "group_count",
    "hidden",
    "image_shape",
    "is_custom",
    "layout",
    "layout_hash",
    "lenet_sizes",
    "parameter_count",
    "positive_int",
    "refuse_standard_library",
    "validate_model_spec",
    "with_hash",
]
