"""Our TFRecord writer produces files TensorFlow reads, byte-identically for identical input."""
import io

import pytest

from ehr_pipeline.contract import tfrecord


def _write(records):
    buf = io.BytesIO()
    tfrecord.write_records(buf, records)
    return buf.getvalue()


def test_tensorflow_reads_our_records(tmp_path):
    import tensorflow as tf

    records = [b"", b"a", b"x" * 100_000, bytes(range(256))]
    path = tmp_path / "r.tfrecord.gz"
    path.write_bytes(_write(records))
    got = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]
    assert got == records


def test_bytes_are_deterministic_and_round_trip():
    records = [b"one", b"two", b"three"]
    a, b = _write(records), _write(records)
    assert a == b
    assert list(tfrecord.read_records(io.BytesIO(a))) == records


def test_corruption_is_detected():
    import gzip

    raw = bytearray(gzip.decompress(_write([b"payload-bytes"])))
    raw[14] ^= 0xFF  # flip a payload byte
    corrupt = io.BytesIO()
    with gzip.GzipFile(fileobj=corrupt, mode="wb") as gz:
        gz.write(bytes(raw))
    with pytest.raises(ValueError, match="payload CRC"):
        list(tfrecord.read_records(io.BytesIO(corrupt.getvalue())))
