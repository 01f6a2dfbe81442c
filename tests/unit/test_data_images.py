"""Image folders: good folders load as flat channel-first float32; bad ones name the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from meshfl.errors import DataError
from models.data import load_dataset_file
from models.datasets import split_dataset_file
from models.images import load_image_folder, parse_image_size


def _png(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def _rgb(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3))


def _folder(root: Path, classes=("cat", "dog"), per_class=2, h=4, w=5) -> Path:
    for c, name in enumerate(classes):
        for i in range(per_class):
            _png(root / name / f"{i}.png", _rgb(h, w, 10 * c + i))
    return root


def _one_line_naming(error: pytest.ExceptionInfo[DataError], name: str) -> None:
    message = str(error.value)
    assert name in message and "\n" not in message and ";" in message, message


def test_folder_loads_channel_first_scaled(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("b_dog", "a_cat"))
    folder = load_image_folder(root)
    assert folder.classes == ["a_cat", "b_dog"]  # sorted names → labels 0, 1
    assert folder.shape == (3, 4, 5)
    assert folder.x.dtype == np.float32 and folder.x.shape == (4, 60)
    np.testing.assert_array_equal(folder.y, [0, 0, 1, 1])
    pixels = np.asarray(Image.open(root / "a_cat" / "1.png"), dtype=np.float32)
    expected = pixels.transpose(2, 0, 1).reshape(-1) / 255.0
    np.testing.assert_allclose(folder.x[1], expected, rtol=0, atol=1e-7)
    assert folder.x.min() >= 0.0 and folder.x.max() <= 1.0


def test_grayscale_and_resize(tmp_path):
    root = _folder(tmp_path / "imgs", h=6, w=6)
    _png(root / "cat" / "big.png", _rgb(12, 9, 99))
    folder = load_image_folder(root, size=(3, 2), grayscale=True)
    assert folder.shape == (1, 3, 2) and folder.x.shape == (5, 6)
    np.testing.assert_array_equal(folder.y, [0, 0, 0, 1, 1])


def test_hidden_files_are_ignored(tmp_path):
    root = _folder(tmp_path / "imgs")
    (root / "cat" / ".DS_Store").write_bytes(b"junk")
    (root / ".cache").mkdir()
    assert load_image_folder(root).x.shape[0] == 4


def test_load_dataset_file_takes_a_directory(tmp_path):
    root = _folder(tmp_path / "imgs", per_class=5)
    x, y = load_dataset_file(root)
    assert x.shape == (10, 60) and y.dtype == np.int64
    x_small, _ = load_dataset_file(root, image_size=(2, 2), grayscale=True)
    assert x_small.shape == (10, 4)
    split = split_dataset_file(root, 2, 0.5, seed=0, image_size=(2, 2))
    assert (len(split.y_train), len(split.y_test)) == (8, 2)
    np.testing.assert_array_equal(np.sort(split.y_test), [0, 1])


def test_empty_folder(tmp_path):
    (tmp_path / "imgs").mkdir()
    with pytest.raises(DataError, match="no class sub-folders") as info:
        load_dataset_file(tmp_path / "imgs")
    _one_line_naming(info, "imgs")


def test_one_class_is_refused(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("only",))
    with pytest.raises(DataError, match="only one class") as info:
        load_image_folder(root)
    _one_line_naming(info, "imgs")


def test_class_folder_without_images(tmp_path):
    root = _folder(tmp_path / "imgs")
    (root / "empty_class").mkdir()
    with pytest.raises(DataError, match="holds no images") as info:
        load_image_folder(root)
    _one_line_naming(info, "empty_class")


@pytest.mark.parametrize(
    ("name", "content"),
    [("broken.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40), ("notes.txt", b"hello")],
    ids=["corrupt-png", "text-file"],
)
def test_corrupt_or_non_image_file_is_named(tmp_path, name, content):
    root = _folder(tmp_path / "imgs")
    (root / "dog" / name).write_bytes(content)
    with pytest.raises(DataError, match="not a readable image") as info:
        load_dataset_file(root)
    _one_line_naming(info, name)


def test_truncated_image_is_named(tmp_path):
    root = _folder(tmp_path / "imgs", h=32, w=32)
    good = (root / "dog" / "0.png").read_bytes()
    (root / "dog" / "cut.png").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="not a readable image") as info:
        load_image_folder(root)
    _one_line_naming(info, "cut.png")


def test_mixed_sizes_need_an_image_size(tmp_path):
    root = _folder(tmp_path / "imgs")
    _png(root / "dog" / "wide.png", _rgb(4, 9, 7))
    with pytest.raises(DataError, match="--image-size") as info:
        load_image_folder(root)
    _one_line_naming(info, "wide.png")
    assert load_image_folder(root, size=(4, 5)).x.shape == (5, 60)


def test_nested_folder_is_refused(tmp_path):
    root = _folder(tmp_path / "imgs")
    (root / "dog" / "more").mkdir()
    with pytest.raises(DataError, match="inside a class folder") as info:
        load_image_folder(root)
    _one_line_naming(info, "more")


def test_decompression_bomb_protection_stays_on(tmp_path, monkeypatch):
    root = _folder(tmp_path / "imgs", h=20, w=20)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)  # 400 pixels > 2 × 50: an error
    with pytest.raises(DataError, match="decompression-bomb") as info:
        load_image_folder(root)
    _one_line_naming(info, "0.png")


@pytest.mark.parametrize(
    ("text", "size"), [("28x28", (28, 28)), ("32X16", (32, 16)), ("8", (8, 8))]
)
def test_parse_image_size(text, size):
    assert parse_image_size(text) == size


@pytest.mark.parametrize("text", ["", "x", "0x4", "4x4x4", "ax4"])
def test_parse_image_size_refuses(text):
    with pytest.raises(DataError, match="HxW"):
        parse_image_size(text)


def test_parse_image_size_refuses_more_than_the_pixel_limit():
    assert parse_image_size("4096x4096") == (4096, 4096)
    with pytest.raises(DataError, match=r"--image-size '100000x100000' .* more than the limit"):
        parse_image_size("100000x100000")
    with pytest.raises(DataError, match="more than the limit"):
        parse_image_size("4097x4096")


def _png16(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint16)).save(path)
    return path


def test_16_bit_images_are_scaled_by_their_bit_depth(tmp_path):
    levels = np.array([[0, 1000], [32768, 65535]])
    _png16(tmp_path / "imgs" / "a" / "0.png", levels)
    _png16(tmp_path / "imgs" / "b" / "0.png", levels // 2)
    with Image.open(tmp_path / "imgs" / "a" / "0.png") as image:
        assert image.mode.startswith("I")  # Pillow reads it as 16-bit, not 8-bit
    gray = load_image_folder(tmp_path / "imgs", grayscale=True)
    assert gray.shape == (1, 2, 2)
    np.testing.assert_allclose(gray.x[0], levels.reshape(-1) / 65535.0, rtol=1e-6)
    np.testing.assert_allclose(gray.x[1], (levels // 2).reshape(-1) / 65535.0, rtol=1e-6)
    assert 0.0 < gray.x.max() <= 1.0 and (gray.x < 1.0).sum() == 7  # not saturated to 1
    rgb = load_image_folder(tmp_path / "imgs")
    assert rgb.shape == (3, 2, 2)
    np.testing.assert_allclose(rgb.x[0], np.tile(levels.reshape(-1) / 65535.0, 3), rtol=1e-6)
    resized = load_image_folder(tmp_path / "imgs", size=(4, 4), grayscale=True)
    assert resized.x.shape == (2, 16) and resized.x.min() >= 0.0 and resized.x.max() <= 1.0


def test_float_images_are_refused(tmp_path):
    root = _folder(tmp_path / "imgs")
    Image.fromarray(np.full((4, 5), 3.5, dtype=np.float32), mode="F").save(root / "cat" / "f.tif")
    with pytest.raises(DataError, match="floating-point image") as info:
        load_image_folder(root)
    _one_line_naming(info, "f.tif")
