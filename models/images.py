"""Image folders: one sub-folder per class, read with Pillow into flat float32 rows.

Layout (as torchvision's ``ImageFolder``)::

    DIR/cat/0001.png
    DIR/cat/0002.jpg
    DIR/dog/0001.png

Class names are the sub-folder names in sorted order, labelled 0 … K−1. Every image is
converted to RGB (or 8-bit grayscale), brought to one size (H, W), scaled to [0, 1] and
flattened channel-first. 16-bit grayscale images (Pillow modes ``I;16*``, and ``I``
holding values 0 … 65535) are scaled by 1/65535 (their channel repeated for RGB); 32-bit
and floating-point images are refused. At most :data:`MAX_IMAGE_PIXELS` pixels (H·W) per
image after resizing (C·H·W, the order of ``torch.Tensor.flatten`` on a (C, H, W)
image). Hidden files and folders (a leading ``.``) are ignored; any other file in a class
folder must be an image. Pillow's decompression-bomb protection stays on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from meshfl.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["MAX_IMAGE_PIXELS", "ImageFolder", "load_image_folder", "parse_image_size"]

MAX_IMAGE_PIXELS = 4096 * 4096
"""Most pixels (height × width) an image may have after resizing (``--image-size``)."""


class ImageFolder(NamedTuple):
    """An image folder's data.

    ``x`` float32 (n, C·H·W) in [0, 1], channel-first; ``y`` int64 (n,) in 0 … K−1;
    ``classes`` the K class (sub-folder) names, label order; ``shape`` (C, H, W) of one
    image (C is 1 for grayscale, 3 for RGB).
    """

    x: np.ndarray
    y: np.ndarray
    classes: list[str]
    shape: tuple[int, int, int]


def parse_image_size(text: str | None) -> tuple[int, int] | None:
    """Parse ``"HxW"`` (e.g. ``"28x28"``) or ``"N"`` (N×N) into (H, W) pixels; None stays None.

    Raises
    ------
    DataError
        Not of that form, a side < 1, or more than :data:`MAX_IMAGE_PIXELS` pixels.

    """
    if text is None:
        return None
    parts = text.lower().replace("×", "x").split("x")
    try:
        sides = [int(p) for p in parts]
    except ValueError:
        sides = []
    if len(sides) == 1:
        sides = sides * 2
    if len(sides) != 2 or min(sides) < 1:
        raise DataError(f"--image-size {text!r} is not HxW; give e.g. 28x28 (height x width)")
    if sides[0] * sides[1] > MAX_IMAGE_PIXELS:
        raise DataError(
            f"--image-size {text!r} has {sides[0] * sides[1]} pixels, more than the limit "
            f"{MAX_IMAGE_PIXELS} (4096x4096); give a smaller size, e.g. 224x224"
        )
    return sides[0], sides[1]


def _visible(entries: list[Path]) -> list[Path]:
    return sorted(e for e in entries if not e.name.startswith("."))


def _fail(path: Path, problem: str, fix: str) -> DataError:
    return DataError(f"{path}: {problem}; {fix}")


def _sixteen_bit(path: Path, image: Image.Image) -> Image.Image | None:
    """A 16-bit grayscale image as mode ``F`` holding value / 65535; None for other modes."""
    from PIL import Image

    if image.mode not in ("I", "F") and not image.mode.startswith("I;16"):
        return None
    values = np.asarray(image)
    if image.mode == "F" or values.min() < 0 or values.max() > 65535:
        raise _fail(
            path,
            f"a 32-bit or floating-point image (Pillow mode {image.mode})",
            "save it as an 8- or 16-bit PNG",
        )
    return Image.fromarray(values.astype(np.float32) / np.float32(65535.0), mode="F")


def _read(path: Path, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    """One image as float32 (H, W, C) in [0, 1]; ``size`` None keeps its own size."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            deep = _sixteen_bit(path, image)
            converted = deep if deep is not None else image.convert(mode)
    except Image.DecompressionBombError:
        raise _fail(
            path,
            "larger than Pillow's decompression-bomb limit",
            "shrink the image or remove it from the folder",
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise _fail(
            path,
            f"not a readable image ({type(error).__name__})",
            "remove it or replace it with a PNG/JPEG image",
        ) from None
    if converted.width * converted.height > MAX_IMAGE_PIXELS and size is None:
        raise _fail(
            path,
            f"image is {converted.height}x{converted.width}, more than {MAX_IMAGE_PIXELS} pixels",
            "pass a smaller --image-size HxW",
        )
    if size is not None and converted.size != (size[1], size[0]):
        converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    if deep is not None:
        plane = np.clip(np.asarray(converted, dtype=np.float32), 0.0, 1.0)
        return np.repeat(plane[:, :, None], 1 if mode == "L" else 3, axis=2)
    pixels = np.asarray(converted, dtype=np.uint8) / np.float32(255.0)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def load_image_folder(
    path: str | Path, size: tuple[int, int] | None = None, grayscale: bool = False
) -> ImageFolder:
    """Read an image folder (one sub-folder per class) into flat float32 rows.

    Parameters
    ----------
    path : str or Path
        The folder; its sub-folders (sorted by name) are the classes 0 … K−1, K ≥ 2.
    size : tuple[int, int], optional
        (height, width) in pixels every image is resized to (bilinear). None (default)
        takes the first image's size (first class, first file by name) and requires every
        other image to have it.
    grayscale : bool, default False
        Convert to 8-bit grayscale (C = 1) instead of RGB (C = 3; alpha is dropped).

    Returns
    -------
    ImageFolder
        ``x`` float32 (n, C·H·W) = pixel / 255 (16-bit: / 65535) flattened channel-first,
        ``y`` int64 (n,), ``classes`` (K names), ``shape`` (C, H, W).

    Raises
    ------
    DataError
        One line naming the folder or file: no class sub-folders, fewer than 2 classes, a
        class folder without images, a nested folder, a file that is not a readable image
        (or exceeds Pillow's decompression-bomb limit), a 32-bit or floating-point image, an
        image of another size when ``size`` is None, more than :data:`MAX_IMAGE_PIXELS`
        pixels, or more data than memory holds.

    """
    root = Path(path)
    if not root.is_dir():
        raise _fail(root, "no such image folder", "check the path")
    class_dirs = [d for d in _visible(list(root.iterdir())) if d.is_dir()]
    if not class_dirs:
        raise _fail(
            root,
            "no class sub-folders in the image folder",
            "put each class's images in a sub-folder named after the class",
        )
    if len(class_dirs) < 2:
        raise _fail(
            root,
            f"only one class sub-folder ({class_dirs[0].name})",
            "a classifier needs two or more classes, one sub-folder each",
        )
    files: list[tuple[Path, int]] = []
    for label, class_dir in enumerate(class_dirs):
        entries = _visible(list(class_dir.iterdir()))
        nested = [e for e in entries if e.is_dir()]
        if nested:
            raise _fail(nested[0], "a folder inside a class folder", "put images directly in it")
        if not entries:
            raise _fail(class_dir, "class folder holds no images", "add images or remove it")
        files.extend((f, label) for f in entries)
    mode = "L" if grayscale else "RGB"
    first = _read(files[0][0], mode, size)
    height, width, channels = first.shape
    try:
        x = np.empty((len(files), channels * height * width), dtype=np.float32)
    except MemoryError:
        raise _fail(
            root,
            f"{len(files)} images of {channels}x{height}x{width} do not fit in memory",
            "pass a smaller --image-size HxW or use fewer images",
        ) from None
    for row, (file, _) in enumerate(files):
        pixels = first if row == 0 else _read(file, mode, size)
        if pixels.shape != first.shape:
            raise _fail(
                file,
                f"image is {pixels.shape[0]}x{pixels.shape[1]} but {files[0][0].name} is "
                f"{height}x{width}",
                "resize them all to one size or pass --image-size HxW",
            )
        x[row] = pixels.transpose(2, 0, 1).reshape(-1)
    y = np.array([label for _, label in files], dtype=np.int64)
    return ImageFolder(x, y, [d.name for d in class_dirs], (channels, height, width))
