"""Model zoo, ``state_dict`` ⇄ ordered arrays, data files, built-in datasets and partitioners.

The submodules are imported on demand so that ``import models`` stays cheap (no torch, no
scikit-learn):

- :mod:`models.zoo`: ``build_model(spec, seed)`` and the known model names.
- :mod:`models.arrays`: ``to_arrays``, ``load_arrays``, ``spec_hash``.
- :mod:`models.data`: loading ``.npz``/``.csv`` data files, checking them against a model.
- :mod:`models.datasets`: the W1 digits split, Dirichlet/IID partitioners, per-device files.
"""

from __future__ import annotations

__all__ = ["arrays", "data", "datasets", "zoo"]
