"""The typed table schemas agree with the real v1.4 headers."""
import gzip

import pytest

from ehr_pipeline.reader import table_schemas


@pytest.mark.parametrize("name", sorted(n for n, t in table_schemas.TABLES.items() if n != "CHARTEVENTS"))
def test_schema_columns_match_demo_header(demo_dir, name):
    with gzip.open(demo_dir / f"{name}.csv.gz", "rt") as f:
        header = [h.strip('"').upper() for h in f.readline().rstrip("\r\n").split(",")]
    assert tuple(header) == table_schemas.TABLES[name].column_names


def test_ids_are_required_and_typed():
    for table in table_schemas.TABLES.values():
        for col in table.columns:
            if col.name in ("ROW_ID", "SUBJECT_ID"):
                assert col.type is table_schemas.ColType.INT
                assert not col.nullable, (table.name, col.name)


def test_lookup_is_case_insensitive_and_names_unknowns():
    assert table_schemas.get("labevents").name == "LABEVENTS"
    with pytest.raises(KeyError, match="NOTATABLE"):
        table_schemas.get("NOTATABLE")
