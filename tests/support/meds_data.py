"""MEDS test data helpers (not a test module): ACES labels, meds-testing-helpers datasets."""
from __future__ import annotations

import glob
import pathlib

from tests.support.paths import REPO_ROOT
TASK_CONFIG = REPO_ROOT / "configs" / "tasks" / "in_hospital_mortality_24h.yaml"


def aces_labels(meds_dir, config_path, out_dir) -> pathlib.Path:
    """Runs ACES (es-aces, its Python API) once over every data file of a MEDS dataset; writes out_dir/labels.parquet.

    Two things seen with es-aces 0.7.3 on polars 1.44 shape this: a subject's static rows (null time,
    first in MEDS) made it misplace event-bound windows (windows ending days after the discharge, rows
    with null prediction times on the demo), and querying several files in one process carried state
    from one file to the next. So ACES gets the timed rows (the task reads no static code) of all the
    files as one table, in one call.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from aces import config, predicates, query
    from aces.run import get_and_validate_label_schema
    from omegaconf import DictConfig

    task = config.TaskExtractorConfig.load(config_path=pathlib.Path(config_path))
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(glob.glob(str(pathlib.Path(meds_dir) / "data" / "**" / "*.parquet"), recursive=True))
    tables = [pq.read_table(f, columns=["subject_id", "time", "code", "numeric_value"]) for f in files]
    rows = pa.concat_tables(tables)
    rows = rows.filter(pc.is_valid(rows.column("time"))).sort_by([("subject_id", "ascending"), ("time", "ascending")])
    timed = out / "_timed_rows.parquet"
    pq.write_table(rows, timed)
    try:
        result = query.query(task, predicates.get_predicates_df(task, DictConfig({"path": str(timed),
                                                                                 "standard": "meds"})))
    finally:
        timed.unlink()
    # As aces-cli names them for MEDS output.
    result = result.rename({"index_timestamp": "prediction_time", "label": "boolean_value"})
    table = get_and_validate_label_schema(result)
    # ACES writes all-null integer/float/categorical columns, which the label schema refuses: drop them.
    keep = [c for c in table.column_names if table.num_rows == 0 or table.column(c).null_count < table.num_rows]
    path = out / "labels.parquet"
    pq.write_table(table.select(keep), path)
    return path
