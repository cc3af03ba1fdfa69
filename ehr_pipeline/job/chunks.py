"""Event chunks: one example's events from one block, packed for the shuffle as ONE bytes object.

Both sources of the Beam job (MIMIC-III CSVs and MEDS) emit their events in this form, keyed
by example, and the bagging step reads them back; nothing else depends on the layout.
"""
from __future__ import annotations

import struct

import numpy as np

# One admission's events from one block, packed for the shuffle as ONE bytes object. The local
# runner's GroupByKey keeps every grouped value as a decoded Python object, so a chunk made of
# arrays, tuples and one str per code costs hundreds of bytes of object headers; a single
# bytes value costs one. Layout (little-endian):
#   header <q t0 seconds, B time width (4|8), B index width (2|4), I events, I codes, I code-blob bytes,
#           I units, I unit-blob bytes>
#   code blob (codes joined by NUL), unit blob (units joined by NUL), time deltas, code indices,
#   unit indices (u2, 0 = no unit, k = the k-th unit), float64 values
#   [origin, MIMIC-III rows only: <I file index, q first ROW_ID, q first line, B ROW_ID width (2|4|8),
#    B line width>, ROW_ID deltas, line deltas]
# A chunk comes from one block of one file, so the file is named once; ROW_IDs and lines of a block
# lie close together, so their deltas take 2 or 4 bytes: the events' spill grew from 18.2 to 22.9 bytes per
# (event, admission) on the demo, from 17.5 to 21.7 on a 1,000-patient synthetic release (+25%, +24%).
EventChunk = bytes
_HEADER = struct.Struct("<qBBIIIII")
_ORIGIN = struct.Struct("<IqqBB")
_D_DTYPES = {2: "<u2", 4: "<u4", 8: "<i8"}
# (file index, ROW_IDs int64, physical lines int64) of a chunk's events, in their order.
Origin = tuple[int, np.ndarray, np.ndarray]
_T_DTYPES = {4: "<u4", 8: "<i8"}
_I_DTYPES = {2: "<u2", 4: "<i4"}


def _blob(words) -> bytes:
    blob = "\0".join(str(w) for w in words).encode("utf-8")
    if blob.count(b"\0") != max(len(words) - 1, 0):
        raise ValueError(f"an event code or unit contains a NUL character: {[w for w in words if chr(0) in w][:3]}")
    return blob


def _deltas(a: np.ndarray) -> tuple[int, int, bytes]:
    """(first value, width, the deltas from the least value in the narrowest of 2, 4 or 8 bytes)."""
    a = np.asarray(a, dtype=np.int64)
    low = int(a.min()) if a.size else 0
    span = int(a.max()) - low if a.size else 0
    width = 2 if span < 2**16 else 4 if span < 2**32 else 8
    return low, width, (a - low).astype(_D_DTYPES[width]).tobytes()


def pack_chunk(times: np.ndarray, codes: np.ndarray, values: np.ndarray, units: np.ndarray | None = None,
               origin: Origin | None = None) -> EventChunk:
    """Packs (times s, codes, values, units as written or None) compactly: deltas and small indices, exact values.

    ``origin``: (file index, ROW_IDs, physical lines) of the events' rows (MIMIC-III tables), read back
    by ``unpack_origin``; without it the chunk is what it always was.
    """
    uniq, inv = np.unique(np.asarray(codes, dtype=np.str_), return_inverse=True)
    times = np.asarray(times, dtype=np.int64)
    units = np.full(times.size, None, dtype=object) if units is None else np.asarray(units, dtype=object)
    has_unit = np.asarray([u is not None for u in units], dtype=bool)
    unit_words, unit_inv = np.unique(units[has_unit].astype(np.str_), return_inverse=True) if has_unit.any() \
        else (np.zeros(0, np.str_), np.zeros(0, np.int64))
    if len(unit_words) >= 2**16 - 1:
        raise ValueError(f"{len(unit_words)} distinct units in one chunk: more than a chunk can index")
    unit_index = np.zeros(times.size, dtype="<u2")
    unit_index[has_unit] = unit_inv + 1
    t0 = int(times.min()) if times.size else 0
    delta = times - t0
    t_width = 4 if times.size == 0 or int(delta.max()) < 2**32 else 8
    i_width = 2 if len(uniq) < 2**16 else 4
    code_blob, unit_blob = _blob(uniq), _blob(unit_words)
    return b"".join((
        _HEADER.pack(t0, t_width, i_width, times.size, len(uniq), len(code_blob), len(unit_words), len(unit_blob)),
        code_blob, unit_blob,
        delta.astype(_T_DTYPES[t_width]).tobytes(), inv.astype(_I_DTYPES[i_width]).tobytes(), unit_index.tobytes(),
        np.asarray(values, dtype="<f8").tobytes(), _packed_origin(origin, times.size)))


def _packed_origin(origin: Origin | None, n: int) -> bytes:
    if origin is None:
        return b""
    file_index, row_ids, lines = origin
    if len(row_ids) != n or len(lines) != n:
        raise ValueError(f"origin of {len(row_ids)} ROW_IDs and {len(lines)} lines for {n} events")
    row0, row_width, row_deltas = _deltas(row_ids)
    line0, line_width, line_deltas = _deltas(lines)
    return _ORIGIN.pack(file_index, row0, line0, row_width, line_width) + row_deltas + line_deltas


def _words(chunk: bytes, pos: int, n: int, length: int) -> list[str]:
    return chunk[pos:pos + length].decode("utf-8").split("\0") if n else []


def unpack_chunk(chunk: EventChunk) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of pack_chunk: (times int64 s, codes fixed-width str array, values float64, units object array)."""
    t0, t_width, i_width, n, n_codes, code_len, n_units, unit_len = _HEADER.unpack_from(chunk)
    pos = _HEADER.size
    # Fixed-width str from here on: ordering, bagging and statistics then use it without a copy.
    codes = np.asarray(_words(chunk, pos, n_codes, code_len), dtype=np.str_)
    pos += code_len
    units = np.asarray([None] + _words(chunk, pos, n_units, unit_len), dtype=object)
    pos += unit_len
    times = np.frombuffer(chunk, _T_DTYPES[t_width], n, pos).astype(np.int64) + t0
    pos += n * t_width
    index = np.frombuffer(chunk, _I_DTYPES[i_width], n, pos)
    pos += n * i_width
    unit_index = np.frombuffer(chunk, "<u2", n, pos)
    pos += n * 2
    values = np.frombuffer(chunk, "<f8", n, pos).copy()
    return times, codes[index], values, units[unit_index]


def unpack_origin(chunk: EventChunk) -> Origin | None:
    """The (file index, ROW_IDs int64, lines int64) pack_chunk was given, or None for a chunk packed without."""
    t0, t_width, i_width, n, n_codes, code_len, n_units, unit_len = _HEADER.unpack_from(chunk)
    pos = _HEADER.size + code_len + unit_len + n * (t_width + i_width + 2 + 8)
    if pos == len(chunk):
        return None
    file_index, row0, line0, row_width, line_width = _ORIGIN.unpack_from(chunk, pos)
    pos += _ORIGIN.size
    row_ids = np.frombuffer(chunk, _D_DTYPES[row_width], n, pos).astype(np.int64) + row0
    pos += n * row_width
    lines = np.frombuffer(chunk, _D_DTYPES[line_width], n, pos).astype(np.int64) + line0
    return file_index, row_ids, lines


def concat_chunks(chunks: list[EventChunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unpacks and concatenates chunks into (times, codes, values, units) arrays."""
    if not chunks:
        return np.zeros(0, np.int64), np.zeros(0, np.str_), np.zeros(0, np.float64), np.zeros(0, object)
    parts = [unpack_chunk(c) for c in chunks]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))
