"""A data folder (the Beam job's output) as the model side reads it: its side files, once, and a
split's records, parsed once.

Training, evaluation, the export writer and the command lines read a data folder through this
module only. ``read_split`` reads a split's TFRecords and parses them in one call of
``ehr_pipeline.contract.tf_parse``; everything a caller needs of a case (label, ids, trigger time,
who the patient is, which sources the history holds) comes out of that one parse, so no caller
reads or parses the same records again.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import tensorflow as tf

from ehr_pipeline.contract import layout, parse_pipeline_config, spec, tf_parse

# The context features a report groups cases by.
CASE_ATTRIBUTES = (spec.GENDER, spec.AGE_YEARS, spec.ADMISSION_TYPE, spec.ETHNICITY, spec.INSURANCE)


@dataclasses.dataclass(frozen=True)
class DataFiles:
    """The side files of a Beam job output folder, read once."""

    data_dir: str
    vocabulary: dict[str, list[str]]  # source -> codes, most frequent first
    numeric_stats: dict[str, dict[str, float]]  # code -> {mean, std, n}
    clip_z: float
    manifest: dict[str, Any]
    pipeline_config: dict[str, Any]  # the manifest's "config": the settings the data was made with

    def path(self, name: str) -> str:
        """Path of a file in the data folder."""
        return os.path.join(self.data_dir, name)

    def split_pattern(self, split: str) -> str:
        """Glob of one split's TFRecord shards."""
        return self.path(spec.split_file_pattern(split))

    def num_examples(self, split: str) -> int | None:
        """Examples in a split according to the manifest (None if it does not say)."""
        return (self.manifest.get("splits", {}).get(split) or {}).get("examples")


def load_data_files(data_dir: str | os.PathLike[str]) -> DataFiles:
    """Reads vocabulary.json, numeric_stats.json and manifest.json of a Beam job output folder."""
    data_dir = os.fspath(data_dir)
    missing = [n for n in (layout.VOCABULARY, layout.NUMERIC_STATS, layout.MANIFEST)
               if not os.path.exists(os.path.join(data_dir, n))]
    if missing:
        raise FileNotFoundError(f"{data_dir}: not a pipeline output folder, missing {missing}")
    vocab_doc = layout.read_json(os.path.join(data_dir, layout.VOCABULARY))
    stats_doc = layout.read_json(os.path.join(data_dir, layout.NUMERIC_STATS))
    manifest = layout.read_json(os.path.join(data_dir, layout.MANIFEST))
    vocabulary = vocab_doc.get("sources")
    codes = stats_doc.get("codes")
    if not isinstance(vocabulary, dict) or not isinstance(codes, dict):
        raise ValueError(f"{data_dir}: {layout.VOCABULARY} needs a 'sources' mapping and "
                         f"{layout.NUMERIC_STATS} a 'codes' mapping")
    # clip_z is a pipeline setting: the manifest's config is its one source of truth
    # (validated, so a hand-edited manifest with a bad value fails here, not in training).
    pipeline_cfg = manifest.get("config") or {}
    clip_z = parse_pipeline_config(pipeline_cfg, source=f"{data_dir}/manifest.json").numeric.clip_z
    return DataFiles(data_dir=data_dir, vocabulary=vocabulary, numeric_stats=codes, clip_z=float(clip_z),
                     manifest=manifest, pipeline_config=pipeline_cfg)



def manifest_sha256(data_dir: str | os.PathLike[str]) -> str:
    """SHA-256 of a data folder's manifest.json: identifies the data a model was trained on (its model card says)."""
    return layout.sha256_of(os.path.join(os.fspath(data_dir), layout.MANIFEST))


def admission_type_counts(data_dir: str | os.PathLike[str], split: str = "train") -> dict[str, int]:
    """Examples per admission_type (as the examples carry it) in a split's TFRecords; {} without any."""
    paths = sorted(tf.io.gfile.glob(os.path.join(os.fspath(data_dir), spec.split_file_pattern(split))))
    counts: dict[str, int] = {}
    if not paths:
        return counts
    wanted = {spec.ADMISSION_TYPE: tf.io.FixedLenFeature([], tf.string)}
    # Only the one context feature is parsed: a full-size training split passes in seconds.
    for batch in tf.data.TFRecordDataset(paths, compression_type=spec.COMPRESSION).batch(4096):
        context, _, _ = tf.io.parse_sequence_example(batch, context_features=wanted)
        for value in context[spec.ADMISSION_TYPE].numpy().tolist():
            name = value.decode("utf-8")
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


@dataclasses.dataclass(frozen=True)
class SplitRecords:
    """One split's serialized examples (file order) and what one parse of them says about each case."""

    records: list[bytes]
    labels: list[int]
    hadm_ids: list[int]
    subject_ids: list[int]
    trigger_times: list[int]  # seconds since 1970 (shifted MIMIC dates): a MEDS label row's prediction_time
    attributes: dict[str, np.ndarray]  # CASE_ATTRIBUTES -> [N]: who the cases are (for reports, never model inputs)
    num_bags: np.ndarray  # int64 [N]
    sources_present: dict[str, np.ndarray]  # spec.SOURCES -> bool [N]: any event of that source before the trigger
    code_events: dict[str, int] = dataclasses.field(default_factory=dict)  # "source:code" -> events in the split

    def __len__(self) -> int:
        return len(self.records)


def read_split(files: DataFiles, split: str) -> SplitRecords:
    """Every serialized example of a split (file order), parsed once; FileNotFoundError without shards."""
    paths = sorted(tf.io.gfile.glob(files.split_pattern(split)))
    if not paths:
        raise FileNotFoundError(f"no TFRecord files for split {split!r} in {files.data_dir}")
    records = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(paths, compression_type=spec.COMPRESSION)]
    if not records:
        return SplitRecords([], [], [], [], [], {k: np.zeros(0, object) for k in CASE_ATTRIBUTES},
                            np.zeros(0, np.int64), {s: np.zeros(0, bool) for s in spec.SOURCES})
    parsed = tf_parse.parse_sequence_examples(tf.constant(records))
    attributes = {}
    for key in CASE_ATTRIBUTES:
        values = parsed[key].numpy()
        attributes[key] = (np.array([v.decode("utf-8") for v in values], dtype=object) if values.dtype == object
                           else values.astype(np.float64))
    codes = parsed[spec.BAG_CODES].merge_dims(1, 2)  # [N, (codes of all bags)]
    owner = codes.value_rowids().numpy()
    source = tf.strings.regex_replace(codes.flat_values, spec.CODE_SEPARATOR + ".*$", "").numpy()
    present = {s: np.bincount(owner[source == s.encode()], minlength=len(records)) > 0 for s in spec.SOURCES}
    names, counts = np.unique(codes.flat_values.numpy(), return_counts=True)
    return SplitRecords(records=records, labels=parsed[spec.LABEL].numpy().tolist(),
                        hadm_ids=parsed[spec.HADM_ID].numpy().tolist(),
                        subject_ids=parsed[spec.SUBJECT_ID].numpy().tolist(),
                        trigger_times=parsed[spec.TRIGGER_TIME].numpy().tolist(), attributes=attributes,
                        num_bags=parsed[spec.NUM_BAGS].numpy(), sources_present=present,
                        code_events={n.decode("utf-8"): int(c) for n, c in zip(names, counts)})
