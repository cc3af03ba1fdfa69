"""Column blocks: the generator's in-memory rows before they become Arrow tables.

A block is a dict of equally long columns: numpy arrays or ``Cat`` string columns, plus
an ``owner`` column (the admission index within the chunk). NULLs are NaN in float
columns and ``NULL`` in int64 / timestamp columns (DOBs before 1970 are negative, so -1
cannot be the marker).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from ehr_pipeline.reader import table_schemas
from ehr_pipeline.synth.catalog import arrow_type

NULL = np.iinfo(np.int64).min

Block = dict[str, "np.ndarray | Cat"]


@dataclasses.dataclass(frozen=True)
class Cat:
    """A string column as int codes into ``vocab``; code -1 (or a None entry) is NULL."""

    codes: np.ndarray
    vocab: tuple[str | None, ...]

    @staticmethod
    def const(value: str | None, n: int) -> "Cat":
        """n copies of one value."""
        return Cat(np.zeros(n, np.int32), (value,))

    def __getitem__(self, idx) -> "Cat":
        return Cat(self.codes[idx], self.vocab)

    def to_arrow(self) -> pa.Array:
        """The column as an Arrow string array (take() on the vocabulary: C++ speed)."""
        codes = pa.array(self.codes.astype(np.int32), mask=self.codes < 0)
        return pa.array(self.vocab, pa.string()).take(codes)


def _concat_cats(cats: list[Cat]) -> Cat:
    vocab: tuple[str | None, ...] = ()
    parts = []
    for c in cats:
        parts.append(np.where(c.codes < 0, -1, c.codes + len(vocab)))
        vocab += c.vocab
    return Cat(np.concatenate(parts).astype(np.int32), vocab)


def concat(blocks: list[Block]) -> Block:
    """Row-wise concatenation of blocks with the same columns."""
    blocks = [b for b in blocks if b]
    if not blocks:
        return {}
    out: Block = {}
    for name in blocks[0]:
        cols = [b[name] for b in blocks]
        out[name] = _concat_cats(cols) if isinstance(cols[0], Cat) else np.concatenate(cols)
    return out


def take(block: Block, idx: np.ndarray) -> Block:
    """Rows ``idx`` (indices or a boolean mask) of every column."""
    return {k: v[idx] for k, v in block.items()}


def size(block: Block) -> int:
    """Number of rows (0 for an empty block)."""
    return int(block["owner"].size) if block else 0


def to_arrow(value, col: table_schemas.Column) -> pa.Array:
    """One generator column as the Arrow array of a schema column."""
    typ = arrow_type(col.type)
    if isinstance(value, Cat):
        return value.to_arrow()
    if isinstance(value, pa.Array):
        return value if value.type == typ else value.cast(typ)
    arr = np.asarray(value)
    if col.type is table_schemas.ColType.FLOAT:
        return pa.array(arr.astype(np.float64), mask=np.isnan(arr) if arr.dtype.kind == "f" else None)
    if col.type in (table_schemas.ColType.INT, table_schemas.ColType.TIMESTAMP):
        arr = arr.astype(np.int64)
        mask = arr == NULL
        return pa.array(arr, type=typ, mask=mask if mask.any() else None)
    raise TypeError(f"{col.name}: string columns must be Cat or Arrow arrays")


def to_table(table: str, columns: dict, n_rows: int) -> pa.Table:
    """Arrow table of ``table``'s schema columns except ROW_ID; absent columns are NULL."""
    schema = table_schemas.TABLES[table]
    arrays, names = [], []
    for col in schema.columns:
        if col.name == "ROW_ID":
            continue
        if col.name in columns:
            arr = to_arrow(columns[col.name], col)
        elif col.nullable:
            arr = pa.nulls(n_rows, arrow_type(col.type))
        else:
            raise ValueError(f"{table}.{col.name} is NOT NULL but the generator gave no values")
        if len(arr) != n_rows:
            raise ValueError(f"{table}.{col.name}: {len(arr)} values for {n_rows} rows")
        arrays.append(arr)
        names.append(col.name)
    return pa.Table.from_arrays(arrays, names=names)
