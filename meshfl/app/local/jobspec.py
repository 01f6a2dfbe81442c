"""The job a ``meshfl local`` run starts: its data cut over the agents, its model, its spec.

The spec's options come from the config through the one table of job options
(:mod:`meshfl.contract.job_options`), exactly as ``meshfl job start`` sends them.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np

from meshfl.app.local.config import LocalConfig
from meshfl.app.local.validation import topology_fields
from meshfl.contract import MAX_CLASSES, JobSpec, ModelSpec, job_spec_fields
from meshfl.errors import ConfigError, DataError

__all__ = ["check_codec_policy", "job_spec", "model_spec", "prepare_data"]


def prepare_data(config: LocalConfig) -> tuple[list[Path], Path]:
    """Partition the training set over the agents and the ``join_at`` joiners, in order."""
    from models.builtin import BUILTIN_DATASETS, load_split
    from models.datasets import dirichlet_partition, write_partition

    devices = config.agents + len(config.join_at)
    split = load_split(
        config.dataset, config.seed, n_devices=devices, label_column=config.label_column
    )
    if config.dataset not in BUILTIN_DATASETS:
        path = Path(config.dataset)
        _check_labels(path, split.x_train, np.concatenate([split.y_train, split.y_test]))
    parts = dirichlet_partition(split.y_train, devices, config.alpha, config.seed)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            f"the Dirichlet(α={config.alpha}) partition left device(s) {empty} without data;"
            " use fewer --agents, a larger --alpha or another --seed"
        )
    files, test_file = write_partition(config.out / "data", split, parts)
    return list(files), test_file


def _check_labels(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """A user dataset must have features and labels 0..K-1 with 2 <= K <= MAX_CLASSES."""
    if x.shape[1] == 0:
        raise DataError(f"{path}: no feature columns; add features besides the label")
    classes = np.unique(y)
    if len(classes) < 2:
        raise DataError(f"{path}: only one class ({classes[0]}); a classifier needs two or more")
    if int(classes[-1]) >= MAX_CLASSES or int(classes[-1]) >= 10 * len(classes):
        raise DataError(
            f"{path}: labels go up to {int(classes[-1])} for {len(classes)} classes; number"
            " the classes 0..K-1"
        )


def check_codec_policy(spec: JobSpec) -> None:
    """Refuse a byte budget that cannot work for the job's model before agents decline it."""
    if not spec.get("byte_budget"):
        return
    from meshfl.codecs import CodecPolicy, parse_codec
    from models.arrays import to_arrays
    from models.zoo import build_model

    layout = [(k, tuple(v.shape)) for k, v in to_arrays(build_model(spec["model"], 0)).items()]
    try:
        CodecPolicy.from_options(
            parse_codec(spec["codec"]), layout, spec.get("dense_below", 0), spec["byte_budget"]
        )
    except ConfigError as exc:
        raise ConfigError(f"--byte-budget {spec['byte_budget']}: {exc}") from None


def model_spec(config: LocalConfig, input_dim: int, classes: int) -> ModelSpec:
    """The job's model; a user model is built here once to refuse it early and hash it."""
    from meshfl.modelspec import from_options, is_custom

    spec = from_options(
        config.model,
        input_dim,
        classes,
        hidden=None if config.hidden is None else list(config.hidden),
        image_shape=None if config.image_shape is None else list(config.image_shape),
        kwargs=config.model_kwargs,
    )
    if is_custom(spec):  # the coordinator cannot hash it: the spec must carry its hash
        from models.arrays import spec_hash, to_arrays
        from models.zoo import build_model

        model = build_model(spec, config.seed)
        # What every agent would decline the job for, refused before it starts.
        for name, array in to_arrays(model).items():
            if not np.issubdtype(array.dtype, np.floating):
                raise ConfigError(
                    f"--model {config.model}: tensor {name!r} has dtype {array.dtype}; every"
                    " tensor of the state_dict travels as float32 (BatchNorm counts batches"
                    " in int64: use track_running_stats=False, GroupNorm or LayerNorm)"
                )
        spec["hash"] = spec_hash(model)
    return spec


def job_spec(config: LocalConfig, test_file: Path) -> JobSpec:
    """The run's job: the config's job options (:func:`job_spec_fields`) on its data.

    ``elastic`` is implied by ``join_at``; in a private job (DP or secure aggregation)
    devices publish no model, since they release nothing but what that protects.
    """
    from models.data import load_dataset_file

    x, y = load_dataset_file(test_file)
    classes = int(y.max()) + 1  # the stratified test set holds every class
    if config.dataset in ("digits", "mnist1d"):
        classes = 10
    options = {**config.job_options(), "elastic": config.elastic or bool(config.join_at)}
    spec = {
        "name": f"local-{Path(config.dataset).stem}",
        "model": model_spec(config, int(x.shape[1]), classes),
        **job_spec_fields(options),
        **topology_fields(config.topology),
        "seed": config.seed if config.model_seed is None else config.model_seed,
        "devices": config.agents,
        "test_data": str(test_file.resolve()),
        "publish_model": not (config.dp_noise_multiplier > 0 or config.secure_aggregation > 0),
    }
    return cast(JobSpec, spec)
