"""DATA_DIR -> model tensors: vocabulary lookup, z-scored numeric values, log counts, bag times.

The same ``Featurizer`` runs in the training input pipeline (tf.data) and inside the exported
SavedModel, so serving sees exactly the transformation training saw (no train/serve skew).
Its lookup tables are TensorFlow resources tracked by the module, so ``tf.saved_model.save``
carries them along.

Per code entry of a bag (a "token") the model gets:
  * an id: vocabulary codes get their own id; an unknown code gets the out-of-vocabulary
    (OOV) id of its source ("lab", "chart", ...), and a code of an unknown source the
    shared unknown-source id, so rare labs and rare drugs do not share one vector;
  * NUM_VALUE_FEATURES floats: z(mean), z(last), z(min), z(max) of the bag's values (z-scores
    from the training split's statistics, clipped to +-clip_z), has_value, log(1 + events of
    the code). The extremes are what severity scores (SAPS-II, APACHE) score: the worst value.
Per bag: log(1 + hours before the trigger) / 10, log(1 + distinct codes) / 10 (both ~O(1)),
1 if the bag lies in the current admission (its newest event at or after admission), 0 for
older history (earlier admissions' diagnoses, say), and log(1 + events) / 10 of each source:
how often labs are drawn and vitals charted is itself a strong signal of acuity in ICU data,
and a pooled token vector keeps it only diluted.
Per admission: age / 90, one-hot gender, one-hot admission type.

Time inputs (``TIME_INPUTS``, each switched on by the model config's ``time_inputs``; none by default,
which is also what an export made before they existed reads): a duration t enters as
``time_scales(t)``, exp(-t / tau) for tau = 1 hour, 1 day, 1 week, 30 days, 365 days and
log(1 + t / 1 day) / 10. Each decay moves most around its own tau (by 0.63 of its range from 0 to
tau, by nearly all the rest up to 10 tau), so hours, days, weeks, months and years each have a
feature that tells them apart, where log(1 + hours) / 10 puts 30 to 1,000 days within 0.66-1.0; the log keeps
the order over decades. The inputs, appended in TIME_INPUTS order:
  * "bag_gap", per bag: time_scales(time since the previous bag's newest event) and 1 for the first
    bag (its gap is unknown: zeros);
  * "trigger_scales", per bag: time_scales(time from the bag's newest event to the trigger);
  * "since_admit", per bag in the current admission: time_scales(time from the admission's start to
    the bag's newest event) (zeros for older history);
  * "previous_discharge", per bag 1 when the bag lies at or before the previous admission's discharge;
    per admission 1 when there is a previous discharge, and time_scales(trigger - that discharge)
    (zeros without one);
  * "value_change", per valued token (appended to its value features, not to the bag's): the change of the
    code's z(last) since the code's previous valued bag in the record, 1 when there is one, and
    time_scales(time between the two bags) (zeros without one). It is the last observation and the time
    since it that GRU-D (Che et al., 2018) gives every variable: a sequence model reads how a value moves, and
    how fast, from two numbers next to it instead of differencing across steps through its state.
All are differences of the record's offsets and values (spec.BAG_OFFSET, ADMIT_OFFSET, PREVIOUS_DISCHARGE,
BAG_VALUE_LAST): computed here once, for training and inside the export alike.

With ``window_hours`` set, the Featurizer also writes "window_aggregates", the input of the
model's linear ("wide") part: per admission, one dense row of
  * log(1 + events) of each code id in the window (bags whose newest event lies at most
    window_hours before the trigger), then the same over older history (ids as above, so a
    rare code counts in its source's OOV column);
  * per code with training statistics (sorted): over the window's valued tokens, min z of the
    bags' minima, max z of their maxima, the count-weighted mean z, the newest bag's last z,
    and 1 when the window has no value (its z columns are then 0);
  * the context above.
A severity score is a sum of such per-analyte terms of the worst value in a window; a
recurrent network has to learn to carry each running extreme across bags, a linear layer on
these columns gets them for free. Columns: ``window_aggregate_names``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from ehr_pipeline.contract import spec, tf_parse
from model.data_folder import DataFiles

# MIMIC-III ADMISSIONS.ADMISSION_TYPE values; anything else maps to one extra "other" slot.
# TODO(spec owner): this list belongs in ehr_pipeline.contract.spec next to GENDERS.
ADMISSION_TYPES = ("ELECTIVE", "EMERGENCY", "NEWBORN", "URGENT")
NUM_VALUE_FEATURES = 6  # z_mean, z_last, z_min, z_max, has_value, log1p(count)
WINDOW_VALUE_STATS = ("z_min", "z_max", "z_mean", "z_last", "no_value")  # per value code, window_aggregates
# log1p(hours before trigger) / 10, log1p(codes in bag) / 10, in current admission, log1p(events) / 10 per source
NUM_BAG_FEATURES = 3 + len(spec.SOURCES)
CONTEXT_DIM = 1 + len(spec.GENDERS) + len(ADMISSION_TYPES) + 1
DEFAULT_CLIP_Z = 10.0  # the pipeline's numeric.clip_z default, for a Featurizer built without a data folder (docs/model.md, Inputs)
_LOG_SCALE = 10.0  # log1p(hours) reaches ~11 for ten years of history: /10 keeps features ~O(1)

TIME_INPUTS = ("bag_gap", "trigger_scales", "since_admit", "previous_discharge", "value_change")
# time_scales: the decays' time constants (s) and the log's unit (s).
TIME_SCALE_SECONDS = (3600.0, 86400.0, 7 * 86400.0, 30 * 86400.0, 365 * 86400.0)
_LOG_DAY_SECONDS = 86400.0
NUM_TIME_SCALES = len(TIME_SCALE_SECONDS) + 1
# Width each time input adds to a bag's features and to the context.
_TIME_BAG_WIDTH = {"bag_gap": NUM_TIME_SCALES + 1, "trigger_scales": NUM_TIME_SCALES,
                   "since_admit": NUM_TIME_SCALES, "previous_discharge": 1, "value_change": 0}
_TIME_CONTEXT_WIDTH = {"bag_gap": 0, "trigger_scales": 0, "since_admit": 0, "previous_discharge": 1 + NUM_TIME_SCALES,
                       "value_change": 0}
_TIME_VALUE_WIDTH = {"value_change": 2 + NUM_TIME_SCALES}  # per token: dz, has a previous value, time_scales


def time_inputs_in_order(time_inputs) -> tuple[str, ...]:
    """The time inputs named, in TIME_INPUTS order (the order their features are appended); ValueError on others."""
    unknown = sorted(set(time_inputs) - set(TIME_INPUTS))
    if unknown:
        raise ValueError(f"unknown time inputs {unknown}; known: {TIME_INPUTS}")
    return tuple(t for t in TIME_INPUTS if t in set(time_inputs))


def bag_feature_dim(time_inputs=()) -> int:
    """Width of a bag's features: NUM_BAG_FEATURES and those of the time inputs."""
    return NUM_BAG_FEATURES + sum(_TIME_BAG_WIDTH[t] for t in time_inputs_in_order(time_inputs))


def value_feature_dim(time_inputs=()) -> int:
    """Width of a token's "code_values" row: NUM_VALUE_FEATURES and those of the time inputs."""
    return NUM_VALUE_FEATURES + sum(_TIME_VALUE_WIDTH.get(t, 0) for t in time_inputs_in_order(time_inputs))


def context_dim(time_inputs=()) -> int:
    """Width of the context row: CONTEXT_DIM and that of the time inputs."""
    return CONTEXT_DIM + sum(_TIME_CONTEXT_WIDTH[t] for t in time_inputs_in_order(time_inputs))


def time_scales(seconds: tf.Tensor) -> tf.Tensor:
    """[..., NUM_TIME_SCALES] of durations (s, >= 0): exp(-t / tau) per TIME_SCALE_SECONDS, log(1 + t / day) / 10."""
    t = tf.maximum(tf.cast(seconds, tf.float32), 0.0)[..., None]
    decays = tf.exp(-t / tf.constant(TIME_SCALE_SECONDS, tf.float32))
    return tf.concat([decays, tf.math.log1p(t / _LOG_DAY_SECONDS) / _LOG_SCALE], axis=-1)



class Featurizer(tf.Module):
    """Parsed SequenceExample batch (tf_parse.parse_sequence_examples) -> model tensors."""

    def __init__(self, vocabulary: Mapping[str, list[str]], numeric_stats: Mapping[str, Mapping[str, float]],
                 clip_z: float = DEFAULT_CLIP_Z, window_hours: float | None = None, name: str | None = None,
                 time_inputs: Sequence[str] = ()):
        super().__init__(name=name)
        self.time_inputs = time_inputs_in_order(time_inputs)
        if not clip_z > 0:
            raise ValueError(f"clip_z must be > 0, got {clip_z}")
        if window_hours is not None and not window_hours > 0:
            raise ValueError(f"window_hours must be > 0, got {window_hours}")
        self.window_hours = None if window_hours is None else float(window_hours)
        unknown = sorted(set(vocabulary) - set(spec.SOURCES))
        if unknown:
            raise ValueError(f"vocabulary has unknown sources {unknown}; known: {spec.SOURCES}")
        self.clip_z = float(clip_z)
        # Ids: [0, len(SOURCES)) per-source OOV, len(SOURCES) unknown source, then the codes.
        self.num_oov = len(spec.SOURCES) + 1
        codes = [c for source in sorted(vocabulary) for c in vocabulary[source]]
        if len(set(codes)) != len(codes):
            raise ValueError("vocabulary lists a code twice")
        self.vocab_size = self.num_oov + len(codes)
        self._code_table = _table(codes, range(self.num_oov, self.vocab_size), tf.int64)
        self._source_table = _table(list(spec.SOURCES), range(len(spec.SOURCES)), tf.int64)
        stat_codes = sorted(numeric_stats)
        self._stat_table = _table(stat_codes, range(len(stat_codes)), tf.int64)
        # One extra row (mean 0, std 1) is the target of "no statistics": index -1 -> last row.
        self.value_codes = tuple(stat_codes)
        self._mean = tf.constant([float(numeric_stats[c]["mean"]) for c in stat_codes] + [0.0], tf.float32)
        self._std = tf.constant([float(numeric_stats[c]["std"]) for c in stat_codes] + [1.0], tf.float32)
        self._genders = _table(list(spec.GENDERS), range(len(spec.GENDERS)), tf.int64)
        self._admission_types = _table(list(ADMISSION_TYPES), range(len(ADMISSION_TYPES)), tf.int64)

        self._id_names = ([f"{source}{spec.CODE_SEPARATOR}<oov>" for source in spec.SOURCES] + ["<unknown source>"]
                          + codes)

    @classmethod
    def from_data_files(cls, files: DataFiles, window_hours: float | None = None,
                        time_inputs: Sequence[str] = ()) -> Featurizer:
        """The featurizer of a data folder (its vocabulary, statistics and clip_z); window_hours, time_inputs: see the module."""
        return cls(files.vocabulary, files.numeric_stats, files.clip_z, window_hours, time_inputs=time_inputs)

    @property
    def bag_feature_dim(self) -> int:
        """Width of a "bag_features" row."""
        return bag_feature_dim(self.time_inputs)

    @property
    def value_feature_dim(self) -> int:
        """Width of a "code_values" row."""
        return value_feature_dim(self.time_inputs)

    @property
    def context_dim(self) -> int:
        """Width of a "context" row."""
        return context_dim(self.time_inputs)

    @property
    def window_aggregate_dim(self) -> int:
        """Width of a "window_aggregates" row: 2 per code id, 5 per code with statistics, the context."""
        return 2 * self.vocab_size + len(WINDOW_VALUE_STATS) * len(self.value_codes) + self.context_dim

    def window_aggregate_names(self) -> list[str]:
        """One name per "window_aggregates" column, in column order."""
        names = [f"window_log_count[{c}]" for c in self._id_names]
        names += [f"history_log_count[{c}]" for c in self._id_names]
        names += [f"{stat}[{c}]" for stat in WINDOW_VALUE_STATS for c in self.value_codes]
        names += ["age_years/90"] + [f"gender={g}" for g in spec.GENDERS]
        names += [f"admission_type={t}" for t in ADMISSION_TYPES] + ["admission_type=other"]
        if "previous_discharge" in self.time_inputs:
            names += ["has_previous_discharge"] + [f"previous_discharge_{s}" for s in _time_scale_names()]
        return names

    def code_ids(self, codes: tf.Tensor) -> tf.Tensor:
        """int64 ids of 'source:code' strings (any shape); unknown codes get their source's OOV id."""
        ids = self._code_table.lookup(codes)
        oov = self.source_ids(codes)
        return tf.where(ids >= 0, ids, oov)

    def source_ids(self, codes: tf.Tensor) -> tf.Tensor:
        """int64 index in spec.SOURCES of each 'source:code' string; len(SOURCES) for an unknown source."""
        # The source is everything before the first separator (spec.CODE_SEPARATOR).
        source = tf.strings.regex_replace(codes, spec.CODE_SEPARATOR + ".*", "", replace_global=False)
        source_id = self._source_table.lookup(source)
        return tf.where(source_id >= 0, source_id, len(spec.SOURCES))

    def __call__(self, parsed: Mapping[str, Any]) -> dict[str, Any]:
        """Model features of one parsed batch: ragged code ids/values and bag features, dense context."""
        codes = parsed[spec.BAG_CODES]  # ragged [B, (bags), (codes)] of bytes
        flat_codes = codes.flat_values
        ids = self.code_ids(flat_codes)
        stat = self._stat_table.lookup(flat_codes)
        has_stats = stat >= 0
        stat = tf.where(has_stats, stat, tf.cast(tf.shape(self._mean)[0] - 1, tf.int64))
        mean, std = tf.gather(self._mean, stat), tf.gather(self._std, stat)
        value_count = parsed[spec.BAG_VALUE_COUNT].flat_values
        has_value = value_count > 0
        usable = tf.logical_and(has_value, has_stats)

        def z(values: tf.Tensor) -> tf.Tensor:
            # A code without training statistics has no meaningful scale: its z is 0, and
            # has_value still tells the model a value was measured.
            zv = tf.clip_by_value((values - mean) / std, -self.clip_z, self.clip_z)
            return tf.where(usable, zv, tf.zeros_like(zv))

        counts = tf.cast(parsed[spec.BAG_COUNTS].flat_values, tf.float32)
        values = tf.stack([
            *(z(parsed[key].flat_values)
              for key in (spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST, spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX)),
            tf.cast(has_value, tf.float32),
            tf.math.log1p(counts),
        ], axis=-1)

        offsets = parsed[spec.BAG_OFFSET]  # ragged [B, (bags)] seconds
        token_bag = codes.values.value_rowids()  # [tokens] index into the batch's flat bags
        # Each token's admission: only the value changes and the window's aggregates read it.
        needs_example = "value_change" in self.time_inputs or self.window_hours is not None
        token_example = tf.gather(codes.value_rowids(), token_bag) if needs_example else None
        if "value_change" in self.time_inputs:
            change = self._value_change(values[:, 1], tf.gather(offsets.flat_values, token_bag), stat, usable,
                                        token_example)
            values = tf.concat([values, change], axis=-1)
        codes_per_bag = tf.cast(codes.values.row_lengths(), tf.float32)
        hours = tf.maximum(offsets.flat_values, 0.0) / 3600.0
        admit_offset = tf.cast(parsed[spec.ADMIT_OFFSET], tf.float32)  # [B] seconds
        in_admission = offsets <= admit_offset[:, None]  # ragged [B, (bags)]
        # Events per (bag, source): one segment per pair; an unknown source (never written by
        # the job, refused by the service) lands in a slot that is cut off.
        n_sources = len(spec.SOURCES) + 1
        pair = token_bag * n_sources + self.source_ids(flat_codes)
        n_flat_bags = codes.values.nrows()
        per_source = tf.reshape(tf.math.unsorted_segment_sum(counts, pair, n_flat_bags * n_sources),
                                [-1, n_sources])[:, :len(spec.SOURCES)]
        bag_time, context_time = self._time_features(offsets, admit_offset, in_admission, parsed)
        bag = tf.concat([
            tf.stack([tf.math.log1p(hours) / _LOG_SCALE, tf.math.log1p(codes_per_bag) / _LOG_SCALE,
                      tf.cast(in_admission.flat_values, tf.float32)], axis=-1),
            tf.math.log1p(per_source) / _LOG_SCALE,
            *bag_time,
        ], axis=-1)

        context = self._context(parsed, context_time)
        features = {
            "code_ids": codes.with_flat_values(ids),
            "code_values": codes.with_flat_values(values),
            "bag_features": offsets.with_flat_values(bag),
            "num_bags": tf.cast(parsed[spec.NUM_BAGS], tf.int32),
            "context": context,
            "label": parsed[spec.LABEL],
            "hadm_id": parsed[spec.HADM_ID],
        }
        if self.window_hours is not None:
            in_window = tf.gather(offsets.flat_values <= self.window_hours * 3600.0, token_bag)
            weight = tf.cast(parsed[spec.BAG_VALUE_COUNT].flat_values, tf.float32)
            features["window_aggregates"] = tf.concat([
                self._window_counts(ids, counts, token_example, in_window, codes.nrows()),
                self._window_values(values, weight, stat, usable, token_example, in_window, codes.nrows()),
                context], axis=-1)
        return features

    def _context(self, parsed: Mapping[str, Any], context_time: list[tf.Tensor]) -> tf.Tensor:
        """[B, .] per-admission inputs: age / cap, gender and admission type one-hots, the time inputs' context."""
        gender = self._genders.lookup(parsed[spec.GENDER])
        adm = self._admission_types.lookup(parsed[spec.ADMISSION_TYPE])
        adm = tf.where(adm >= 0, adm, len(ADMISSION_TYPES))  # unknown type -> the "other" slot
        return tf.concat([
            parsed[spec.AGE_YEARS][:, None] / spec.AGE_CAP_YEARS,
            tf.one_hot(gender, len(spec.GENDERS)),  # an unknown gender (-1) one-hots to zeros
            tf.one_hot(adm, len(ADMISSION_TYPES) + 1),
            *context_time,
        ], axis=-1)

    def _time_features(self, offsets, admit_offset, in_admission, parsed) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        """The time inputs' per-bag ([flat bags, .]) and per-admission ([B, .]) features (module docstring)."""
        flat = offsets.flat_values  # seconds from each bag's newest event to the trigger, oldest bag first
        row = offsets.value_rowids()
        bag_parts, context_parts = [], []
        if "bag_gap" in self.time_inputs:
            # Oldest first, so a bag's predecessor is the flat element before it, within its own row.
            first = tf.concat([tf.ones([tf.minimum(tf.size(row), 1)], tf.bool), row[1:] != row[:-1]], axis=0)
            before = tf.concat([flat[:1], flat[:-1]], axis=0)
            gap = time_scales(before - flat) * (1.0 - tf.cast(first, tf.float32))[:, None]
            bag_parts += [gap, tf.cast(first, tf.float32)[:, None]]
        if "trigger_scales" in self.time_inputs:
            bag_parts.append(time_scales(flat))
        if "since_admit" in self.time_inputs:
            since = tf.gather(admit_offset, row) - flat
            bag_parts.append(time_scales(since) * tf.cast(in_admission.flat_values, tf.float32)[:, None])
        if "previous_discharge" in self.time_inputs:
            previous = tf.cast(parsed[spec.PREVIOUS_DISCHARGE], tf.float32)  # [B] s, NO_PREVIOUS_DISCHARGE = none
            has = tf.cast(tf.not_equal(parsed[spec.PREVIOUS_DISCHARGE], spec.NO_PREVIOUS_DISCHARGE), tf.float32)
            bag_parts.append((tf.cast(flat >= tf.gather(previous, row), tf.float32) * tf.gather(has, row))[:, None])
            context_parts += [has[:, None], time_scales(previous) * has[:, None]]
        return bag_parts, context_parts

    def _value_change(self, z_last, token_offset, stat, usable, token_example) -> tf.Tensor:
        """[tokens, 2 + NUM_TIME_SCALES]: "value_change" (module docstring) of each token.

        z_last: the tokens' z(last); token_offset: their bag's seconds before the trigger; stat: their code's row
        in the statistics; usable: they carry a value with statistics; token_example: their admission.
        """
        n_tokens = tf.shape(stat, out_type=tf.int64)[0]
        position = tf.range(n_tokens)
        # One key per (admission, code with statistics); each unusable token a key of its own, so it has no
        # predecessor and none follows it. A stable sort keeps each key's tokens oldest bag first.
        n_codes = tf.cast(tf.shape(self._mean)[0], tf.int64)
        key = tf.where(usable, token_example * n_codes + stat, -1 - position)
        order = tf.argsort(key, stable=True)
        sorted_key = tf.gather(key, order)
        same = tf.concat([tf.zeros([tf.minimum(n_tokens, 1)], tf.bool), sorted_key[1:] == sorted_key[:-1]], axis=0)
        previous_sorted = tf.concat([order[:1], order[:-1]], axis=0)
        # Back from sorted order to token order: token order[i] has predecessor previous_sorted[i] when same[i].
        inverse = tf.math.invert_permutation(order)
        has = tf.gather(same, inverse)
        previous = tf.gather(previous_sorted, inverse)
        mask = tf.cast(has, tf.float32)[:, None]
        dz = (z_last - tf.gather(z_last, previous))[:, None] * mask
        elapsed = tf.gather(token_offset, previous) - token_offset
        return tf.concat([dz, mask, time_scales(elapsed) * mask], axis=-1)

    def _window_counts(self, ids, counts, token_example, in_window, batch) -> tf.Tensor:
        """[B, 2 * vocab_size]: log(1 + events) of each id in the window, then in older history."""
        pair = token_example * self.vocab_size + ids
        n = batch * self.vocab_size

        def per_id(weights):
            return tf.math.log1p(tf.reshape(tf.math.unsorted_segment_sum(weights, pair, n), [-1, self.vocab_size]))

        zeros = tf.zeros_like(counts)
        return tf.concat([per_id(tf.where(in_window, counts, zeros)), per_id(tf.where(in_window, zeros, counts))],
                         axis=-1)

    def _window_values(self, values, weight, stat, usable, token_example, in_window, batch) -> tf.Tensor:
        """[B, 5 * value codes]: WINDOW_VALUE_STATS blocks over the window's valued tokens.

        values: the tokens' value features (z_mean, z_last, z_min, z_max first); weight: their value counts.
        """
        n_codes = len(self.value_codes)
        if not n_codes:
            return tf.zeros([batch, 0])
        use = tf.logical_and(usable, in_window)
        # Tokens that do not count go to one extra segment, cut off below.
        n = batch * n_codes
        pair = tf.where(use, token_example * n_codes + stat, n)
        weight = tf.where(use, weight, 0.0)
        z_mean, z_last, z_min, z_max = tf.unstack(values[:, :4], axis=-1)

        def per_code(reduce, data):
            return tf.reshape(reduce(data, pair, n + 1)[:n], [-1, n_codes])

        total = per_code(tf.math.unsorted_segment_sum, weight)
        seen = total > 0
        zero = tf.zeros_like(total)
        window_min = tf.where(seen, per_code(tf.math.unsorted_segment_min, z_min), zero)
        window_max = tf.where(seen, per_code(tf.math.unsorted_segment_max, z_max), zero)
        window_mean = tf.math.divide_no_nan(per_code(tf.math.unsorted_segment_sum, weight * z_mean), total)
        # Bags run oldest first, so a code's newest value is its valued token of highest flat index.
        position = tf.range(tf.shape(pair, out_type=tf.int64)[0])
        newest = tf.math.unsorted_segment_max(tf.where(use, position, -1), pair, n + 1)[:n]
        window_last = tf.reshape(tf.where(newest >= 0, tf.gather(z_last, tf.maximum(newest, 0)), 0.0), [-1, n_codes])
        return tf.concat([window_min, window_max, window_mean, window_last, 1.0 - tf.cast(seen, tf.float32)], axis=-1)


def _time_scale_names() -> list[str]:
    """One name per time_scales column."""
    return [f"exp(-t/{s / 3600:g}h)" for s in TIME_SCALE_SECONDS] + ["log1p(t/1d)/10"]


def _table(keys: list[str], values, dtype) -> tf.lookup.StaticHashTable:
    """A string -> id hash table; missing keys give -1."""
    values = list(values)
    if not keys:
        # Tables cannot be empty: map "" (never a code, bag_events refuses empty codes) to "missing".
        keys, values = [""], [-1]
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.constant(values, dtype))
    return tf.lookup.StaticHashTable(init, default_value=tf.constant(-1, dtype))


def dataset(files: DataFiles, featurizer: Featurizer, split: str, batch_size: int, *, training: bool = False,
            seed: int | None = None, shuffle_buffer: int = 4096, cache: bool = False) -> tf.data.Dataset:
    """Batches of (features, labels float32 [B]) for one split; training: shuffled, repeated, full batches.

    cache (training): the first epoch's featurized batches are kept in memory and replayed in a
    fresh order every epoch; a batch's members stay together (they are not reshuffled across
    batches). It removes reading, parsing and featurizing from every later step.
    """
    # The featurizer has no tensor-dependent Python control flow (the export traces it with autograph
    # off): converting it with autograph only costs seconds of every dataset's first trace.
    @tf.autograph.experimental.do_not_convert
    def to_model(parsed):
        feats = featurizer(parsed)
        return feats, tf.cast(feats["label"], tf.float32)

    if training and cache:
        ds = tf_parse.make_dataset(files.split_pattern(split), batch_size, shuffle=True, seed=seed,
                               shuffle_buffer=shuffle_buffer, drop_remainder=True)
        ds = ds.map(to_model, num_parallel_calls=tf.data.AUTOTUNE).cache()
        batches = max(1, int(files.num_examples(split) or 0) // batch_size)
        ds = ds.shuffle(batches, seed=seed, reshuffle_each_iteration=True).repeat()
        return ds.prefetch(tf.data.AUTOTUNE)
    ds = tf_parse.make_dataset(files.split_pattern(split), batch_size, shuffle=training, seed=seed,
                           shuffle_buffer=shuffle_buffer, repeat=training, drop_remainder=training)
    return ds.map(to_model, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
