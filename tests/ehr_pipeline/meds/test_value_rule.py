"""One rule for numbers on both roads: the CSV road (``run --mimic-dir``, ``to-meds``) and the MEDS road
(``run --meds-dir``) keep and refuse the same values, and to-meds never writes one as infinity.

The expected verdict is computed apart from both readers: a value is kept when it is finite and no larger
in magnitude than the largest float32 (MEDS stores numeric_value as float32).
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ehr_pipeline.meds.from_mimic import event_rows
from ehr_pipeline.meds.source import MedsReader
from ehr_pipeline.mimic import events as ev
from ehr_pipeline.reader import read_table

LARGEST_FLOAT32 = float(np.finfo(np.float32).max)
HEADER = '"ROW_ID","SUBJECT_ID","HADM_ID","ITEMID","CHARTTIME","VALUE","VALUENUM","VALUEUOM","FLAG"\n'


def _meds_keeps(table: pa.Table) -> bool:
    """Whether the MEDS source keeps the one row of a MEDS table."""
    kept, _ = MedsReader._without_dead_rows(table, "data/0.parquet", 0)
    return kept.num_rows == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.floats(allow_nan=True, allow_infinity=True))
@example(1e39)
@example(-1e300)
@example(LARGEST_FLOAT32)
@example(math.nextafter(LARGEST_FLOAT32, math.inf))  # rounds to the largest float32, yet lies beyond it
@example(1e-50)  # a float32 holds it as 0: finite, kept
def test_both_roads_keep_and_refuse_the_same_values(tmp_path, value):
    expected = math.isfinite(value) and abs(value) <= LARGEST_FLOAT32
    path = tmp_path / "LABEVENTS.csv"
    path.write_text(HEADER + f'1,7,100,50912,2101-01-01 10:00:00,"x",{value!r},"mg/dL",\n')
    dead: list = []
    table, stats = read_table(path, "LABEVENTS", on_dead_letter=dead.append)
    assert (stats.rows_parsed == 1) == expected
    assert [d.reason for d in dead] == ([] if expected else ["bad_number"])  # counted, never dropped silently

    # The MEDS road meeting the same number in a dataset another ETL wrote (a float64 column).
    other_etl = pa.table({"subject_id": [7], "time": pa.array([0], pa.timestamp("us")), "code": ["LAB//50912//mg/dL"],
                          "numeric_value": pa.array([value], pa.float64())})
    assert _meds_keeps(other_etl) == expected

    if expected:  # what to-meds writes of a kept value is finite, and the MEDS road keeps it in turn
        events, _ = ev.extract("LABEVENTS", table)
        rows = event_rows(events)
        written = rows.column("numeric_value")[0].as_py()
        assert math.isfinite(written) and written == float(np.float32(value))
        assert _meds_keeps(rows)
