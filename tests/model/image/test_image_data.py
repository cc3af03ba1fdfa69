"""Image data: digits splits, CIFAR python-pickle reader on tiny files in the real format, tf.data augmentation."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import tensorflow as tf

from model.image import data as d
from model.image.config import DataConfig


def _cifar_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows in the official layout: 1024 red, then 1024 green, then 1024 blue values (uint8)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return images, images.transpose(0, 3, 1, 2).reshape(n, 3072)


def _write_batch(path, rows, labels, label_key=b"labels"):
    # The official files: Python-2 pickles whose keys are bytes.
    batch = {b"batch_label": b"testing batch", label_key: [int(v) for v in labels], b"data": rows,
             b"filenames": [b"x.png"] * len(labels)}
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


@pytest.fixture
def cifar10_dir(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    truth = {}
    for i, name in enumerate([*d.CIFAR10_TRAIN_FILES, d.CIFAR10_TEST_FILE]):
        images, rows = _cifar_rows(4, i)
        labels = (np.arange(4) + i) % 4  # each class 5 times in train: stratifiable
        _write_batch(root / name, rows, labels)
        truth[name] = (images, labels)
    return tmp_path, truth


def test_digits_splits_are_fixed_stratified_disjoint_and_scaled():
    data = d.load_digits_data(validation_fraction=0.1, test_fraction=0.25, seed=0)
    assert data.image_shape == (8, 8, 1) and data.num_classes == 10
    sizes = (data.y_train.size, data.y_val.size, data.y_test.size)
    assert sum(sizes) == 1797 and data.y_test.size == 450
    for x in (data.x_train, data.x_val, data.x_test):
        assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() <= 1.0
    assert data.x_train.max() == 1.0
    for y in (data.y_train, data.y_val, data.y_test):  # every class in every split, in proportion
        counts = np.bincount(y, minlength=10) / y.size
        assert np.all(np.abs(counts - 0.1) < 0.03)
    # Disjoint and fixed: no image row is in two splits; a second load is identical.
    # (The 1797 digits images are all distinct, so a shared row is a shared example.)
    keys = [set(map(bytes, x.reshape(x.shape[0], -1))) for x in (data.x_train, data.x_val, data.x_test)]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert len(keys[0] | keys[1] | keys[2]) == 1797
    again = d.load_digits_data(validation_fraction=0.1, test_fraction=0.25, seed=0)
    np.testing.assert_array_equal(again.x_test, data.x_test)
    assert d.load_digits_data(validation_fraction=0.0).y_val.size == 0


def test_cifar10_reader_real_layout(cifar10_dir):
    root, truth = cifar10_dir
    for folder in (root, root / "cifar-10-batches-py"):  # the parent or the official folder itself
        x_train, y_train, x_test, y_test = d.read_cifar(folder, "cifar10")
        assert x_train.shape == (20, 32, 32, 3) and x_test.shape == (4, 32, 32, 3)
        assert x_train.dtype == np.float32 and y_train.dtype == np.int64
        images, labels = truth["data_batch_2"]
        np.testing.assert_allclose(x_train[4:8], images / 255.0, rtol=1e-6)
        np.testing.assert_array_equal(y_train[4:8], labels)
        np.testing.assert_allclose(x_test, truth["test_batch"][0] / 255.0, rtol=1e-6)


def test_cifar100_reader_fine_labels(tmp_path):
    for name, seed in (("train", 0), ("test", 1)):
        _, rows = _cifar_rows(3, seed)
        batch = {b"data": rows, b"fine_labels": [97, 5, 42], b"coarse_labels": [1, 2, 3]}
        with open(tmp_path / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    x_train, y_train, _, y_test = d.read_cifar(tmp_path, "cifar100")
    assert x_train.shape == (3, 32, 32, 3)
    np.testing.assert_array_equal(y_test, [97, 5, 42])


def test_cifar_errors_name_missing_files(cifar10_dir, tmp_path):
    root, _ = cifar10_dir
    (root / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        d.read_cifar(root, "cifar10")
    with pytest.raises(FileNotFoundError, match="train, test"):
        d.read_cifar(tmp_path / "nowhere", "cifar100")
    with pytest.raises(FileNotFoundError, match="data_dir"):
        d.load_data(DataConfig(dataset="cifar10"))


def test_load_data_cifar_with_validation_split(cifar10_dir):
    root, _ = cifar10_dir
    data = d.load_data(DataConfig(dataset="cifar10", validation_fraction=0.5), data_dir=root)
    assert data.num_classes == 10 and data.y_train.size == 10 and data.y_val.size == 10 and data.y_test.size == 4
    # The validation rows are carved out of the training files: every training row lands in exactly one.
    train, val = (set(map(bytes, x.reshape(x.shape[0], -1))) for x in (data.x_train, data.x_val))
    assert not (train & val) and len(train | val) == 20


def test_augment_is_a_zero_padded_shift_or_its_mirror():
    image = tf.constant(np.random.default_rng(0).random((8, 8, 1)), tf.float32)
    padded = np.pad(image.numpy(), ((2, 2), (2, 2), (0, 0)))
    crops = {(i, j): padded[i:i + 8, j:j + 8] for i in range(5) for j in range(5)}
    seen_flip = seen_plain = False
    for s in range(40):
        out = d.augment(image, tf.constant([7, s], tf.int64), flip=True, crop_padding=2).numpy()
        plain = any(np.array_equal(out, crop) for crop in crops.values())
        mirrored = any(np.array_equal(out[:, ::-1], crop) for crop in crops.values())
        assert plain or mirrored
        seen_plain |= plain and not mirrored
        seen_flip |= mirrored and not plain
    assert seen_flip and seen_plain
    same = d.augment(image, tf.constant([1, 2], tf.int64), flip=False, crop_padding=0)
    np.testing.assert_array_equal(same.numpy(), image.numpy())


def test_train_dataset_batches_reproducible():
    data = d.load_digits_data()
    first = [b for b in d.train_dataset(data.x_train, data.y_train, 16, seed=3, flip=False, crop_padding=1).take(3)]
    again = [b for b in d.train_dataset(data.x_train, data.y_train, 16, seed=3, flip=False, crop_padding=1).take(3)]
    for (x1, y1), (x2, y2) in zip(first, again):
        assert x1.shape == (16, 8, 8, 1) and y1.dtype == tf.int64
        np.testing.assert_array_equal(x1.numpy(), x2.numpy())
        np.testing.assert_array_equal(y1.numpy(), y2.numpy())
    other = next(iter(d.train_dataset(data.x_train, data.y_train, 16, seed=4, flip=False, crop_padding=1)))
    assert not np.array_equal(other[1].numpy(), first[0][1].numpy())
    with pytest.raises(ValueError, match="cannot fill"):
        d.train_dataset(data.x_train[:3], data.y_train[:3], 16, seed=0)
