"""Reading a synthetic release back for the generator's tests: tables as written, and a site's recording undone."""
from __future__ import annotations

import pathlib

import pandas as pd

from ehr_pipeline import reader
from ehr_pipeline.synth import catalog


def read(release: pathlib.Path, table: str, columns=None) -> pd.DataFrame:
    """One table of a release through the project's reader; a dead-lettered row fails the test."""
    tab, stats = reader.read_table(reader.locate_table(release, table), table, columns=columns)
    assert stats.rows_dead == 0, f"{table}: dead letters {stats.dead_lettered}"
    return tab.to_pandas()


def as_site_a_records(t: dict) -> dict[str, pd.DataFrame]:
    """A site's tables with its recording undone, from the manifest (``t["manifest"]``) alone: codes
    mapped back, values in another unit divided by its factor, biased lab values divided by their
    bias, each rounded as the item prints. Outpatient labs included."""
    site = t["manifest"]["site"]
    decimals = {i.itemid: i.decimals for i in catalog.LAB_ITEMS}
    labs = t["LABEVENTS"].copy()
    for itemid, unit in site.get("lab_units", {}).items():
        hit = labs.ITEMID == int(itemid)
        assert (labs.VALUEUOM[hit] == unit["unit"]).all(), itemid
        labs.loc[hit, "VALUENUM"] = (labs.VALUENUM[hit] / unit["factor"]).round(decimals[int(itemid)])
        labs.loc[hit, "VALUEUOM"] = next(i.unit for i in catalog.LAB_ITEMS if i.itemid == int(itemid))
    for itemid, factor in site["lab_bias"].items():
        hit = labs.ITEMID == int(itemid)
        labs.loc[hit, "VALUENUM"] = (labs.VALUENUM[hit] / factor).round(decimals[int(itemid)])
    labs["ITEMID"] = labs.ITEMID.replace({v: int(k) for k, v in site["lab_codes"].items()})
    charts = t["CHARTEVENTS"].copy()
    charts["ITEMID"] = charts.ITEMID.replace({v: int(k) for k, v in site["chart_codes"].items()})
    return {**t, "LABEVENTS": labs, "CHARTEVENTS": charts}
