"""``meshfl data partition``: split a dataset into per-device files for trials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

data_app = typer.Typer(help="Prepare per-device data files.", no_args_is_help=True)


@data_app.command("partition")
def partition(
    out: Annotated[Path, typer.Option(help="Directory for device-*.npz and test.npz.")],
    dataset: Annotated[
        str, typer.Option(help="'digits' (built in) or a .npz/.csv file.")
    ] = "digits",
    devices: Annotated[int, typer.Option(help="Number of devices.")] = 8,
    alpha: Annotated[float, typer.Option(help="Dirichlet α of the label skew.")] = 0.5,
    seed: Annotated[int, typer.Option(help="Partition seed.")] = 0,
    label_column: Annotated[str, typer.Option(help="Label column of a CSV file.")] = "label",
) -> None:
    """Split DATASET 80/20 (stratified), then the training part over DEVICES by Dirichlet(α).

    Writes device-N.npz (arrays x, y, and the test split as x_test, y_test) and
    test.npz. With the defaults this is exactly workload W1.
    """
    from meshfl.errors import ConfigError
    from models.datasets import (
        dirichlet_partition,
        load_digits_split,
        split_dataset_file,
        write_partition,
    )

    if devices < 1:
        raise ConfigError(f"--devices must be at least 1 (got {devices})")
    if dataset == "digits":
        split = load_digits_split(seed)
    else:
        split = split_dataset_file(dataset, devices, alpha, seed, label_column=label_column)
    parts = dirichlet_partition(split.y_train, devices, alpha, seed)
    files, test_file = write_partition(out, split, parts)
    for path, part in zip(files, parts, strict=True):
        typer.echo(f"{path}: {len(part)} samples")
    typer.echo(f"{test_file}: {len(split.y_test)} samples")
