"""Models: which model a job trains (``JobSpec.model``) and the label bound."""

from __future__ import annotations

from typing import Any

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict_request

__all__ = ["MAX_CLASSES", "ModelSpec"]

MAX_CLASSES = 100_000
"""Most classes a model (``ModelSpec.num_classes``) may have; data labels must lie in
``[0, MAX_CLASSES)``."""


@strict_request
class ModelSpec(TypedDict):
    """Which model to train; agents build it from the model zoo by ``name``.

    ``name`` is a zoo model (``mlp``, ``cnn1d``, ``logreg``, ``lenet``, ``resnet``) or
    ``custom``: the agent imports ``factory`` (``"package.module:callable"``) and calls it
    with ``kwargs`` (JSON values). ``image_shape`` ``[C, H, W]`` is how 2-D models read a
    flat sample. ``hash`` (64 hex) is :func:`meshfl.modelspec.layout_hash` of the built
    model: the coordinator fills it for zoo models, a custom spec must carry it, and an
    agent that builds a different layout declines the job. See ``docs/models.md``.
    """

    name: str  # "mlp"
    input_dim: int
    num_classes: int
    hidden: list[int]
    image_shape: NotRequired[list[int]]
    factory: NotRequired[str]
    kwargs: NotRequired[dict[str, Any]]
    hash: NotRequired[str]
