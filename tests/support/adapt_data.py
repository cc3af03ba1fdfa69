"""A site's data folder whose outcomes differ from the model's training data: the same admissions relabelled."""
from __future__ import annotations

import glob
import os
import pathlib
import shutil

import numpy as np
import tensorflow as tf

from ehr_pipeline.contract import layout, spec
from ehr_pipeline.contract.tfrecord import write_records
from model import data_folder


def relabelled_copy(source: str | os.PathLike[str], out: str | os.PathLike[str], *, split: str = "train",
                    death_rate: float, seed: int = 0) -> pathlib.Path:
    """A copy of a data folder whose `split` has labels drawn at death_rate (one shard), its manifest rewritten."""
    out = pathlib.Path(out)
    shutil.copytree(source, out)
    records = data_folder.read_split(data_folder.load_data_files(out), split).records
    rng = np.random.default_rng(seed)
    labels = (rng.random(len(records)) < death_rate).astype(int)
    relabelled = []
    for record, label in zip(records, labels):
        example = tf.train.SequenceExample.FromString(record)
        example.context.feature[spec.LABEL].int64_list.value[:] = [int(label)]
        relabelled.append(example.SerializeToString())
    for path in glob.glob(str(out / spec.split_file_pattern(split))):
        os.remove(path)
    name = spec.shard_file_name(split, 0, 1)
    with open(out / name, "wb") as f:
        write_records(f, relabelled)
    manifest = layout.read_json(str(out / layout.MANIFEST))
    manifest["splits"][split].update({"positives": int(labels.sum()), "label_rate": float(labels.mean()),
                                      "files": {name: {"sha256": layout.sha256_of(str(out / name))}}})
    layout.write_json(str(out / layout.MANIFEST), manifest)
    return out
