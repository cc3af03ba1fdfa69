"""Small typed record batches shaped like the reader's output, for unit tests."""
import pyarrow as pa

from ehr_pipeline.reader import table_schemas

_ARROW = {table_schemas.ColType.INT: pa.int64(), table_schemas.ColType.FLOAT: pa.float64(),
          table_schemas.ColType.TIMESTAMP: pa.int64(), table_schemas.ColType.STR: pa.string()}


def batch(table: str, rows: list[dict]) -> pa.RecordBatch:
    """A RecordBatch shaped like reader.TableReader's (UPPERCASE names, times int64 s), only the given columns."""
    sch = table_schemas.get(table)
    names = list(rows[0])
    return pa.RecordBatch.from_arrays(
        [pa.array([r[n] for r in rows], _ARROW[sch.column(n).type]) for n in names], names=names)
