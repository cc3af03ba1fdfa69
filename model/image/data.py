"""Image data: digits (bundled with scikit-learn), CIFAR-10/100 from local python pickles, tf.data input.

Every loader returns float32 images in [0, 1], shape [N, H, W, C], and int64 labels: the
corruptions (``model.image.corruptions``) act on that range, and the model sees it as is
(batch norm after the first convolution takes care of the scale).

Nothing is downloaded: CIFAR must already be on disk in the official "python version"
layout (``cifar-10-batches-py/data_batch_1..5`` + ``test_batch``, or ``cifar-100-python/train``
+ ``test``). Those files are Python pickles, and unpickling runs code: only point the reader
at copies of the official archives.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle

import numpy as np

from model.image.config import DATASETS, DataConfig

CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR100_TRAIN_FILE, CIFAR100_TEST_FILE = "train", "test"
# The folders the official archives unpack to; the reader accepts them or their parent.
CIFAR_SUBDIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
DIGITS_VALUE_MAX = 16.0  # load_digits pixels are counts 0..16 of an 8x8 grid of 4x4 blocks


@dataclasses.dataclass(frozen=True)
class ImageData:
    """Train / validation / test arrays of one dataset (validation may be empty)."""

    name: str
    num_classes: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def _stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) index arrays: `fraction` of every class held out, chosen by a seeded shuffle."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(y.shape[0])
    if fraction <= 0:
        return idx, idx[:0]
    kept, held = train_test_split(idx, test_size=fraction, stratify=y, random_state=seed)
    # Sorted: the split is a set, and a sorted set does not depend on sklearn's shuffling order.
    return np.sort(kept), np.sort(held)


def load_digits_data(validation_fraction: float = 0.1, test_fraction: float = 0.25, seed: int = 0) -> ImageData:
    """The 1797 8x8 digits as [N, 8, 8, 1] float32 in [0, 1], split stratified and fixed by `seed`."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / DIGITS_VALUE_MAX).astype(np.float32)[..., None]
    y = bunch.target.astype(np.int64)
    rest, test = _stratified_split(y, test_fraction, seed)
    train, val = _stratified_split(y[rest], validation_fraction, seed)
    train, val = rest[train], rest[val]
    return ImageData("digits", 10, x[train], y[train], x[val], y[val], x[test], y[test])


def _cifar_folder(directory: pathlib.Path, dataset: str, names: tuple[str, ...]) -> pathlib.Path:
    """The folder holding all of `names`: `directory` itself or its official sub-folder."""
    for candidate in (directory, directory / CIFAR_SUBDIRS[dataset]):
        if all((candidate / n).is_file() for n in names):
            return candidate
    missing = [n for n in names if not (directory / n).is_file()]
    raise FileNotFoundError(
        f"{directory}: {dataset} python-pickle files missing: {', '.join(missing)} (looked here and in "
        f"{CIFAR_SUBDIRS[dataset]}/; expected {', '.join(names)})")


def read_cifar_batch(path: str | os.PathLike[str], label_key: str = "labels") -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images [n, 32, 32, 3], int64 labels [n]) of one CIFAR python pickle."""
    with open(path, "rb") as f:
        # encoding="bytes": the official files were pickled by Python 2 (keys come back as bytes).
        batch = pickle.load(f, encoding="bytes")  # noqa: S301  (trusted input, see module docstring)

    def get(key: str):
        for k in (key.encode(), key):
            if k in batch:
                return batch[k]
        raise KeyError(f"{path}: no {key!r} entry (keys: {sorted(map(str, batch))})")

    data = np.asarray(get("data"), dtype=np.uint8)
    labels = np.asarray(get(label_key), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: expected data [n, 3072] and n labels, got {data.shape} and {labels.shape}")
    # Rows hold the red, green and blue 32x32 planes one after the other (channels first).
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def read_cifar(directory: str | os.PathLike[str], dataset: str = "cifar10"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of CIFAR-10 or CIFAR-100 (fine labels) as float32 in [0, 1]."""
    root = pathlib.Path(directory)
    if dataset == "cifar10":
        train_names, test_names, key = CIFAR10_TRAIN_FILES, (CIFAR10_TEST_FILE,), "labels"
    elif dataset == "cifar100":
        train_names, test_names, key = (CIFAR100_TRAIN_FILE,), (CIFAR100_TEST_FILE,), "fine_labels"
    else:
        raise ValueError(f"dataset must be 'cifar10' or 'cifar100', got {dataset!r}")
    folder = _cifar_folder(root, dataset, train_names + test_names)

    def read(names):
        parts = [read_cifar_batch(folder / n, key) for n in names]
        x = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
        return x, np.concatenate([p[1] for p in parts])

    x_train, y_train = read(train_names)
    x_test, y_test = read(test_names)
    return x_train, y_train, x_test, y_test


def load_data(config: DataConfig, data_dir: str | os.PathLike[str] | None = None) -> ImageData:
    """The dataset a DataConfig names; `data_dir` overrides config.data_dir (CIFAR only)."""
    if config.dataset == "digits":
        return load_digits_data(config.validation_fraction, config.test_fraction, config.split_seed)
    directory = data_dir if data_dir is not None else config.data_dir
    if directory is None:
        raise FileNotFoundError(f"{config.dataset}: no data folder (set data.data_dir or pass --data)")
    x_train, y_train, x_test, y_test = read_cifar(directory, config.dataset)
    train, val = _stratified_split(y_train, config.validation_fraction, config.split_seed)
    return ImageData(config.dataset, DATASETS[config.dataset], x_train[train], y_train[train], x_train[val],
                     y_train[val], x_test, y_test)


# --------------------------------------------------------------------------- tf.data


def augment(image, seed, *, flip: bool, crop_padding: int):
    """One image, randomly padded-and-cropped and flipped; `seed` is a shape-[2] stateless seed."""
    import tensorflow as tf

    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if crop_padding:
        shape = tf.shape(image)
        p = crop_padding
        padded = tf.pad(image, [[p, p], [p, p], [0, 0]])  # zeros, as resize_with_crop_or_pad pads
        image = tf.image.stateless_random_crop(padded, shape, seed=crop_seed)
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return image


def train_dataset(x: np.ndarray, y: np.ndarray, batch_size: int, *, seed: int, flip: bool = True,
                  crop_padding: int = 4, shuffle_buffer: int = 50000):
    """Endless tf.data stream of augmented (images [B, H, W, C], labels [B]) batches, reproducible from `seed`."""
    import tensorflow as tf

    if x.shape[0] < batch_size:
        raise ValueError(f"{x.shape[0]} training images cannot fill a batch of {batch_size}")
    ds = tf.data.Dataset.from_tensor_slices((x.astype(np.float32), y.astype(np.int64)))
    ds = ds.shuffle(min(shuffle_buffer, x.shape[0]), seed=seed, reshuffle_each_iteration=True).repeat()
    # Stateless per-example seeds (seed, position in the stream): the augmentation of the
    # i-th example is a function of the seed alone, whatever the thread scheduling.
    ds = ds.enumerate().map(
        lambda i, xy: (augment(xy[0], tf.stack([tf.cast(seed, tf.int64), i]), flip=flip, crop_padding=crop_padding),
                       xy[1]),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
