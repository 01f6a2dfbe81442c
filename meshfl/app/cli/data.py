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
        str,
        typer.Option(
            help="Built in (digits, mnist1d, iris, wine, breast_cancer), a .npz/.csv file or"
            " an image folder (one sub-folder per class)."
        ),
    ] = "digits",
    scheme: Annotated[
        str, typer.Option(help="iid, dirichlet (label skew), shards or quantity (size skew).")
    ] = "dirichlet",
    devices: Annotated[int, typer.Option(help="Number of devices.")] = 8,
    alpha: Annotated[float, typer.Option(help="dirichlet: α of the label skew.")] = 0.5,
    shards_per_device: Annotated[int, typer.Option(help="shards: shards per device.")] = 2,
    beta: Annotated[float, typer.Option(help="quantity: β of the size skew.")] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the split and the partition.")] = 0,
    label_column: Annotated[str, typer.Option(help="Label column of a CSV file.")] = "label",
    image_size: Annotated[
        str | None,
        typer.Option(help="Image folders: resize to HxW pixels (default: the first image's)."),
    ] = None,
    grayscale: Annotated[bool, typer.Option(help="Image folders: read as grayscale.")] = False,
) -> None:
    """Split DATASET 80/20 (stratified), then the training part over DEVICES by SCHEME.

    Writes device-N.npz (arrays x, y, and the test split as x_test, y_test) and
    test.npz, and prints each device's size and label distance (total variation from
    the global label mix). With the defaults this is exactly workload W1.
    Every check (options, --out, the data, the partition) runs before a file is written.
    """
    from models.builtin import load_split
    from models.datasets import check_output_dir, write_partition
    from models.images import parse_image_size
    from models.partition import check_request, device_label_distance, label_skew
    from models.partition import partition as make_partition

    check_request(
        scheme, devices, alpha=alpha, shards_per_device=shards_per_device, beta=beta, seed=seed
    )
    size = parse_image_size(image_size)
    check_output_dir(out)
    split = load_split(
        dataset, seed, n_devices=devices, label_column=label_column,
        image_size=size, grayscale=grayscale,
    )  # fmt: skip
    parts = make_partition(
        split.y_train, scheme, devices, seed=seed, alpha=alpha,
        shards_per_device=shards_per_device, beta=beta,
    )  # fmt: skip
    distance = device_label_distance(split.y_train, parts)
    skew = label_skew(split.y_train, parts)
    files, test_file = write_partition(out, split, parts)
    for path, part, tv in zip(files, parts, distance, strict=True):
        classes = len(set(split.y_train[part].tolist()))
        tv_text = "-" if len(part) == 0 else f"{tv:.2f}"
        plural = "" if classes == 1 else "es"
        typer.echo(
            f"{path}: {len(part)} samples, {classes} class{plural}, label distance {tv_text}"
        )
    typer.echo(f"{test_file}: {len(split.y_test)} samples")
    typer.echo(
        f"label skew (mean total-variation distance to the global label mix, 0 = IID): {skew:.3f}"
    )
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        typer.echo(
            f"note: device(s) {empty} got no samples (an agent refuses an empty file);"
            " use a larger --alpha, fewer --devices or another --seed"
        )
