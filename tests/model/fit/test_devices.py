"""Training on 2 logical CPU devices (MirroredStrategy) against 1, for the EHR model and an image MLP:
same losses, gradient norms and weights from one checkpoint; different posterior draws per replica;
a 2-device checkpoint resumes on 1 device. The 2-device work runs in a child process
(tests/support/multidevice_run.py): logical devices must be set before TensorFlow initialises, which this
process has done. One child per module runs the jobs of every selected test (``child``): each process
pays TensorFlow's start-up."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from model.fit import devices
from tests.support.image_configs import TINY
from tests.support.paths import REPO_ROOT

# Relative tolerance on logged scalars (loss, NLL, KL, gradient norm): float32 sums in another
# order across replicas, plus posterior noise of stddev ~1e-6 (tests/support/multidevice_run.py).
RTOL = 1e-4


# An MLP has no batch norm (whose per-replica batch statistics would part the runs), so the image
# trainer on 2 devices must take the 1-device steps exactly as the EHR trainer does: same losses and
# gradient norms, same weights after 4 steps.
IMAGE_MLP = {**TINY, "model": {"architecture": "mlp", "depth": 2, "width": 16,
                               "posterior": {"method": "rank1", "ensemble_size": 2, "random_sign_init": -0.5}}}
# bench/train_speed/gpu_train.py at tiny size; its --out is added by `child`.
GPU_TRAIN_TINY = ["model.rnn_dim=16", "model.hidden_layer_dim=16", "eval.num_samples=2", "eval.n_bootstrap=20",
                  "train.batch_size=8", "train.eval_every_steps=0", "train.log_every_steps=1"]
GPU_TRAIN_ARGS = ["--patients", "40", "--steps", "4", "--devices", "cpu:2",
                  *[x for item in GPU_TRAIN_TINY for x in ("--set", item)]]
# The child's job each test reads (tests/support/multidevice_run.py JOBS).
JOB_OF_TEST = {"test_ehr_trainer_on_two_devices_equals_one": "ehr",
               "test_image_trainer_on_two_devices_equals_one": "image",
               "test_each_replica_draws_its_own_posterior_sample": "draws",
               "test_gpu_train_script_runs_on_cpu_devices_at_tiny_size": "gpu_train"}


@pytest.fixture(scope="module")
def child(request, tmp_path_factory) -> dict:
    """The results of one child process that ran the jobs of the selected tests of this module (job -> result)."""
    out = tmp_path_factory.mktemp("devices")
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    args = {"draws": None, "ehr": None, "image": IMAGE_MLP, "gpu_train": ["--out", str(out / "gpu_train"), *GPU_TRAIN_ARGS]}
    jobs = {job: args[job] for name, job in JOB_OF_TEST.items() if name in selected}
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "support" / "multidevice_run.py"), str(out),
                           json.dumps(jobs)], capture_output=True, text=True, env=env, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads((out / "result.json").read_text()), "out": out}


def _same_rows(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in keys:
            assert ra[key] == pytest.approx(rb[key], rel=RTOL), (ra["step"], key)


def test_device_specs_parse_and_reject_garbage():
    assert devices.parse("cpu:2") == devices.DeviceSpec("cpu", 2)
    assert devices.parse(None) == devices.DeviceSpec("auto") == devices.parse("AUTO")
    assert str(devices.parse("gpu")) == "gpu"
    for bad in ("cpu:0", "tpu:2", "auto:2", "cpu:x", "2"):
        with pytest.raises(ValueError, match="--devices"):
            devices.parse(bad)
    # Once TensorFlow has initialised its devices, a split is refused, not silently ignored.
    assert len(tf.config.list_logical_devices("CPU")) < 5  # (listing initialises them)
    with pytest.raises(RuntimeError, match="before any TensorFlow work"):
        devices.configure("cpu:5")
    assert devices.device_names("cpu") == ["/device:CPU:0"]


def _check_comparison(result: dict, keys: tuple[str, ...]) -> None:
    assert result["base_steps"] == [1, 2, 3, 4, 5, 6]
    one, two = result["from2"]["one"], result["from2"]["two"]
    assert [r["step"] for r in two] == [3, 4, 5, 6]
    _same_rows(two, one, keys)
    # 4 steps move the weights by ~1e-2; the 1- and 2-device runs end within 1e-5 of each other.
    assert result["moved"] > 1e-3 and result["from2_param_diff"] < 1e-3 * result["moved"]
    # A checkpoint written on 2 devices resumes on 1 taking the 1-device run's steps ("one": the
    # continuous 1-device run, which on a one-batch training split takes a resumed run's steps).
    _same_rows(result["from4"]["two"], result["from4"]["one"], keys)
    assert [r["step"] for r in result["from4"]["two"]] == [5, 6]
    assert result["from4_param_diff"] < 1e-3 * result["moved"]


@pytest.mark.slow
def test_ehr_trainer_on_two_devices_equals_one(child):
    _check_comparison(child["ehr"], ("loss", "nll", "kl", "kl_weight", "l2", "grad_norm"))


@pytest.mark.slow
def test_image_trainer_on_two_devices_equals_one(child):
    _check_comparison(child["image"], ("loss", "nll", "kl", "kl_weight", "l2", "grad_norm"))


def test_each_replica_draws_its_own_posterior_sample(child):
    result = child["draws"]
    assert result["replicas"] == 2
    first, second = (np.asarray(x) for x in result["logits"])
    # The same examples, weights and members on both replicas: only the draws can differ.
    assert first.shape == second.shape and np.max(np.abs(first - second)) > 1e-3
    again = np.asarray(result["logits_again"][0])
    assert np.max(np.abs(again - first)) > 1e-3  # and a new call draws anew


@pytest.mark.slow
def test_gpu_train_script_runs_on_cpu_devices_at_tiny_size(child):
    """bench/train_speed/gpu_train.py end to end (synthetic release, Beam job, training, report) on 2 logical CPUs.

    Its main runs in the module's child process (whose 2 CPU devices it asks for), its synth and Beam job
    as the console-script subprocesses it starts.
    """
    result, out = child["gpu_train"], child["out"] / "gpu_train"
    assert result["returncode"] == 0
    summary = json.loads((out / "gpu_train.json").read_text())
    assert summary["steps"] == 4 and summary["steps_per_second"] > 0
    assert summary["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert (out / "run" / "export").is_dir() and "nll" in result["stdout"]
