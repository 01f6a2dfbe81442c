"""Model zoo, ``state_dict`` ⇄ ordered arrays, data files, built-in datasets and partitioners.

The submodules are imported on demand so that ``import models`` stays cheap (no torch, no
scikit-learn):

- :mod:`models.zoo`: ``build_model(spec, seed)`` and the known model names (``MODELS``).
- :mod:`models.vision`: the 2-D ConvNets of the zoo (LeNet, a GroupNorm ResNet).
- :mod:`models.layers`: layer constructors seeded from a local ``torch.Generator``.
- :mod:`models.custom`: user models by import path ``package.module:callable``.
- :mod:`models.arrays`: ``to_arrays``, ``load_arrays``, ``spec_hash``.
- :mod:`models.data`: loading ``.npz``/``.csv`` data files, checking them against a model.
- :mod:`models.datasets`: the W1/W2 splits, splitting user files, per-device files.
- :mod:`models.images`: image folders (one sub-folder per class, read with Pillow).
- :mod:`models.builtin`: the built-in datasets by name (``load_builtin``).
- :mod:`models.partition`: IID, Dirichlet, shards and quantity-skew partitioners.
- :mod:`models.onnx`: ONNX export of a module and its parity check against torch.
"""

from __future__ import annotations

__all__ = [
    "arrays",
    "builtin",
    "custom",
    "data",
    "datasets",
    "images",
    "layers",
    "onnx",
    "partition",
    "vision",
    "zoo",
]
