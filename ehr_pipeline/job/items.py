"""The Beam job's items: their kinds, the job's counters, and the small transforms every stage uses.

The job is composed of named composite PTransforms (``sources``, ``bag``, ``sinks``); ``run``
wires them:

    items    = p | SpillSource(...)  or  p | MedsSource(...)   # tagged (kind, payload) items
    plan     = items | UnitPlan(loinc, reference_units, reference_medians)
    bagged   = items | BagBuckets(BagBucket(...) or BagMedsBucket(...), plan, buckets)
    written  = bagged | MergeShards(out_dir, config[, merge=True])
    ...      counts, dead letters, statistics -> files (run.run_job reads them back)

A source yields, on ONE PCollection, ``(kind, payload)`` pairs: a bucket of spilled events or
examples (``spill``: the spilling stages' own kinds; a MEDS file's reader yields ``EXAMPLE`` (example key,
[its cohort row (a dict), its event chunks (bytes)]) before they are spilled), ``UNITS`` ((code, unit), (rows, magnitude
sketch)) for the unit census, ``COUNTS`` (name, n), ``DEAD`` (file, dead letter) and ``FATAL``
(a one-line error). Both roads bag each example with the same ``BagExample``.
One output with kinds rather than Beam's tagged outputs: the Dask runner does not route tagged
outputs (all tags reach every consumer).

Every counter lives in one namespace (``ehr_pipeline``), named ``stage/source/reason``; the same
(name, n) pairs flow into the manifest, so a record dropped anywhere is counted by reason.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from ehr_pipeline.contract import layout

NAMESPACE = "ehr_pipeline"
EXAMPLE = "example"
EVENTS = "events"
RECORDS = "records"
COUNTS = "counts"
DEAD = "dead"
STATS = "stats"
UNITS = "units"
FATAL = "fatal"  # a file that cannot be read: its one-line error, raised by the driver after the run

Tagged = tuple[str, Any]
KV = tuple[Any, Any]


def count(name: str, n: int) -> tuple[str, int]:
    """Bumps a Beam counter and returns the (name, n) pair that also flows into the manifest."""
    if n:
        Metrics.counter(NAMESPACE, name).inc(int(n))
    return name, int(n)


def counted(prefix: str, counts: Mapping[str, int]):
    """COUNTS items of {reason: n} under 'prefix/reason'."""
    for reason, n in counts.items():
        yield COUNTS, count(f"{prefix}/{reason}", n)


def select(kind: str):
    """A FlatMap function keeping the payloads of one kind."""
    def keep(item):
        if item[0] == kind:
            yield item[1]
    return keep


class Select(beam.PTransform):
    """The payloads of one kind of a tagged PCollection."""

    def __init__(self, kind: str):
        super().__init__()
        self._kind = kind

    def expand(self, items):
        return items | beam.FlatMap(select(self._kind)).with_output_types(KV)


class OneList(beam.PTransform):
    """A PCollection -> one list of its elements ([] when it has none), in no particular order.

    Beam's ``combiners.ToList`` makes the empty list with a side input, and Beam's DaskRunner
    computes a side input again inside the task that reads it: the job's stages upstream ran twice
    on a cluster. Here the list is one GroupByKey group, opened by a marker that is always there.
    """

    def expand(self, pcoll):
        marker = pcoll.pipeline | "Marker" >> beam.Create([(None, (False, None))]).with_output_types(KV)
        return (
            (pcoll | "Key" >> beam.Map(lambda x: (None, (True, x))).with_output_types(KV), marker)
            | "WithMarker" >> beam.Flatten()
            | "Group" >> beam.GroupByKey()
            | "List" >> beam.MapTuple(lambda _, parts: [x for real, x in parts if real])
        )


class ToJsonFile(beam.PTransform):
    """A PCollection -> one JSON file (a sorted list, or the single document with ``single``); yields its name."""

    def __init__(self, path: str, single: bool = False):
        super().__init__()
        self._path, self._single = path, single

    def expand(self, pcoll):
        path, single = self._path, self._single

        def write(items):
            layout.write_json(path, items if single else sorted(items))
            return path

        if single:
            return pcoll | "Write" >> beam.Map(write)
        return pcoll | "List" >> OneList() | "Write" >> beam.Map(write)


class SumCounts(beam.PTransform):
    """(name, n) pairs of every branch -> their sums per name."""

    def expand(self, pcolls):
        return pcolls | "AllCounts" >> beam.Flatten() | "Sum" >> beam.CombinePerKey(sum)
