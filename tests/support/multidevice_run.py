"""Runs in its own process (tests/model/fit/test_devices.py): the CPU split into 2 logical devices.

Logical devices must exist before TensorFlow sets up its devices, which the pytest process
has long done; so the comparisons run here and are written as JSON for the test to check.
One process runs every job the tests ask for: each process pays TensorFlow's start-up (~5 s here).

  python tests/support/multidevice_run.py OUT_DIR JOBS_JSON

JOBS_JSON maps a job (draws, ehr, image, gpu_train) to its argument (the image config; gpu_train's
command line; null for the others); OUT_DIR/result.json maps each job to its result.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pathlib
import runpy
import shutil
import sys

import ehr_base  # noqa: F401  (pins TF_USE_LEGACY_KERAS before TensorFlow loads)
from model import data_folder
from model.fit import devices

devices.configure("cpu:2")  # first: before any TensorFlow work

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Run as a script: the checkout (two folders up) is what makes `tests.support` importable.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.support.ehr_testdata import tiny_config_dict, write_data_dir  # noqa: E402

# Posterior stddevs of ~1e-6 (rank-1 factors) and 1e-9 (embeddings): every draw is its mean
# to ~1e-6, so runs that draw different noise on 1 and 2 devices take the same steps. The KL
# still has its full value and gradient (it is large at such small stddevs).
NEAR_DETERMINISTIC = {"dropout_rate": 1e-12, "embedding_init_stddev": 1e-9}


def model_variables(run: pathlib.Path) -> dict[str, np.ndarray]:
    """The model's variables in the newest checkpoint of a run folder (name -> value)."""
    reader = tf.train.load_checkpoint(str(run / "checkpoints"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.startswith("model/") and "OPTIMIZER_SLOT" not in k}


def resume_copy(run: pathlib.Path, step: int, dest: pathlib.Path) -> pathlib.Path:
    """A copy of a run folder whose newest checkpoint is the one of `step` (as if killed after it)."""
    shutil.copytree(run, dest)
    ckpts = dest / "checkpoints"
    (ckpts / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
    for path in ckpts.glob("ckpt-*"):
        if not path.name.startswith(f"ckpt-{step}."):
            path.unlink()
    return dest


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over equal-named arrays (a and b must have the same names)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def compare(out: pathlib.Path, run) -> dict:
    """1 vs 2 devices from one checkpoint, and a 2-device checkpoint resumed on 1 device.

    run(folder, devices) trains a run folder to step 6 (checkpoints at 2, 4, 6) and returns
    {"history", "variables"}. The runs start from one checkpoint because initialisation
    differs by strategy (variables are created in another order, so with other op seeds).
    The training split is one batch, so every step sees the same examples whatever step a
    stream starts at (a restart reshuffles from its step): the continuous 1-device run
    ``base`` takes the steps a 1-device run resumed at 2 or 4 would take (resuming exactly
    is tests/model/ehr/test_train.py's check), and three trainings stand in for five.
    """
    base = run(out / "base", "cpu:1")
    two = run(resume_copy(out / "base", 2, out / "two_from2"), "cpu:2")
    # The checkpoint of step 4 written on 2 devices, resumed on 1 device.
    two_from4 = run(resume_copy(out / "two_from2", 4, out / "two_from4"), "cpu:1")
    initial = model_variables(resume_copy(out / "base", 2, out / "at2"))

    def after(step: int) -> list[dict]:
        """The continuous run's rows after `step`: what a 1-device run resumed there takes."""
        return [row for row in base["history"] if row["step"] > step]

    return {
        "base_steps": [row["step"] for row in base["history"]],
        "from2": {"one": after(2), "two": two["history"]},
        "from4": {"one": after(4), "two": two_from4["history"]},
        # How far 4 steps move the weights, against how far the 1- and 2-device runs end apart.
        "moved": max_abs_diff(base["variables"], initial),
        "from2_param_diff": max_abs_diff(two["variables"], base["variables"]),
        "from4_param_diff": max_abs_diff(two_from4["variables"], base["variables"]),
    }


KEEP = ("step", "loss", "nll", "kl", "kl_weight", "l2", "grad_norm")


def ehr(out: pathlib.Path, _arg: None = None) -> dict:
    from model.ehr.config import parse_config
    from model.ehr.train import train

    # 16 training admissions: one batch of 16 (compare's one-batch split).
    data = write_data_dir(out / "data", sizes=(("train", 16), ("validation", 4), ("test", 4)))
    doc = tiny_config_dict("rank1", steps=6, log_every_steps=1, checkpoint_every_steps=2)
    doc["model"].update(NEAR_DETERMINISTIC)
    config = parse_config(doc)

    def run(folder, spec):
        result = train(config, data, folder, progress=False, export_model=False, devices=spec)
        return {"history": [{k: row[k] for k in KEEP} for row in result.history], "variables": model_variables(folder)}

    return compare(out, run)


def image(out: pathlib.Path, doc: dict) -> dict:
    from model.image.config import parse_config
    from model.image.data import load_data
    from model.image.train import train

    doc = json.loads(json.dumps(doc))  # the test's tiny image config (a copy: edited below)
    doc["model"]["posterior"]["dropout_rate"] = NEAR_DETERMINISTIC["dropout_rate"]
    doc["train"].update(max_steps=6, log_every_steps=1, checkpoint_every_steps=2)
    # No augmentation and one batch of training images (compare's one-batch split): every step sees
    # the same pixels whatever step a stream starts at.
    doc["data"].update(augment_flip=False, augment_crop_padding=0)
    config = parse_config(doc)
    data = load_data(config.data, None)
    data = dataclasses.replace(data, x_train=data.x_train[:config.train.batch_size],
                               y_train=data.y_train[:config.train.batch_size])

    def run(folder, spec):
        result = train(config, folder, data=data, progress=False, evaluate=False, devices=spec)
        return {"history": [{k: row[k] for k in KEEP} for row in result.history], "variables": model_variables(folder)}

    return compare(out, run)


def draws(out: pathlib.Path, _arg: None = None) -> dict:
    """Logits of the SAME examples on both replicas: equal only if the replicas share their noise."""
    from model.ehr import inputs
    from model.ehr.config import parse_config
    from model.ehr.ehr_model import build_model

    data = write_data_dir(out / "data", sizes=(("train", 16), ("validation", 4), ("test", 4)))
    doc = tiny_config_dict("rank1")
    doc["model"]["dropout_rate"] = 0.1  # posterior stddev 0.33: draws differ visibly
    config = parse_config(doc)
    files = data_folder.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    features, _ = next(iter(inputs.dataset(files, featurizer, "train", 8)))
    strategy = devices.strategy("cpu:2")
    tf.random.set_seed(0)
    with strategy.scope():
        model = build_model(config.model, featurizer.vocab_size)
    model(features, num_samples=1, training=True)  # build outside the replicas

    @tf.function(autograph=False)
    def both():
        return strategy.run(lambda: model(features, num_samples=1, training=True))

    per_replica = strategy.experimental_local_results(both())
    again = strategy.experimental_local_results(both())
    return {"replicas": len(per_replica), "logits": [r.numpy().tolist() for r in per_replica],
            "logits_again": [r.numpy().tolist() for r in again]}


def gpu_train(_out: pathlib.Path, argv: list[str]) -> dict:
    """bench/train_speed/gpu_train.py's main on argv, in this process (its devices.configure finds cpu:2 made)."""
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "train_speed" / "gpu_train.py"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = runpy.run_path(str(script))["main"](argv)
    return {"returncode": code, "stdout": stdout.getvalue()}


JOBS = {"draws": draws, "ehr": ehr, "image": image, "gpu_train": gpu_train}

if __name__ == "__main__":
    out_dir, jobs = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])
    results = {}
    for name, arg in jobs.items():
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        results[name] = JOBS[name](out_dir / name, arg)
    (out_dir / "result.json").write_text(json.dumps(results))
