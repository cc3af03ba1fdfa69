"""A whole synthetic release: chunks of patients streamed into per-table files."""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import sys
import time

import pyarrow as pa
from tqdm import tqdm

import ehr_base
from ehr_pipeline.contract import output_folder
from ehr_pipeline.reader import table_schemas
from ehr_pipeline.synth import catalog
from ehr_pipeline.synth.config import (CHUNK_PATIENTS, HADM_ID_BASE, ICUSTAY_ID_BASE, SUBJECT_ID_BASE,
                                       SynthConfig)
from ehr_pipeline.synth.generator import IdBase, generate_chunk, release_model
from ehr_pipeline.synth.site import SITES, Site
from ehr_pipeline.synth.temporal import TemporalModel
from ehr_pipeline.synth.truth import PLANTED_FACTOR, PLANTED_TERMS, MortalityModel
from ehr_pipeline.synth.writer import ReleaseWriter

log = logging.getLogger(__name__)

TRUTH_FILE = "SYNTH_TRUTH.csv"
TRUTH_COLUMNS = ["HADM_ID", "SUBJECT_ID", "P_DEATH", "DIED", "SEVERITY"]
MANIFEST_FILE = "SYNTH_MANIFEST.json"
# Tables whose rows count as "events" in the summary (everything but people and dictionaries).
EVENT_TABLES = ("LABEVENTS", "CHARTEVENTS", "OUTPUTEVENTS", "INPUTEVENTS_CV", "INPUTEVENTS_MV",
                "PRESCRIPTIONS", "DIAGNOSES_ICD", "PROCEDURES_ICD")


@dataclasses.dataclass(frozen=True)
class SynthSummary:
    """What a release holds and how long it took."""

    out_dir: pathlib.Path
    patients: int
    admissions: int
    deaths: int  # in-hospital deaths, all admissions
    long_admissions: int  # admissions that reach the trigger
    long_deaths: int  # deaths among those (all after the trigger)
    rows: dict[str, int]  # per table, SYNTH_TRUTH included
    events: int  # rows of EVENT_TABLES
    seconds: float  # wall-clock time of the whole release

    @property
    def events_per_second(self) -> float:
        """Event rows written per wall-clock second."""
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    def format(self) -> str:
        """A human-readable multi-line report."""
        width = max(len(t) for t in self.rows)
        lines = [f"synthetic MIMIC-III release in {self.out_dir}",
                 f"  patients {self.patients:,}  admissions {self.admissions:,}  "
                 f"in-hospital deaths {self.deaths:,}",
                 f"  admissions reaching the trigger {self.long_admissions:,}, of which died "
                 f"{self.long_deaths:,} ({100.0 * self.long_deaths / max(self.long_admissions, 1):.1f}%)"]
        lines += [f"  {t:<{width}} {n:>12,}" for t, n in self.rows.items()]
        lines.append(f"  events {self.events:,} in {self.seconds:.1f} s "
                     f"({self.events_per_second:,.0f} events/s, {self.patients / max(self.seconds, 1e-9):,.0f} patients/s)")
        return "\n".join(lines)


def generate_release(out_dir: str | pathlib.Path, patients: int, seed: int,
                     trigger_offset_seconds: int = 86_400, dialect: str = "demo", gzip: bool = True,
                     show_progress: bool = True, *, events_scale: float = 1.0, compresslevel: int = 1,
                     dictionary_dir: str | pathlib.Path | None = None, site: str = "A",
                     plant_subgroup: str | None = None, truth: str = "linear") -> SynthSummary:
    """Writes a synthetic MIMIC-III release (13 tables + SYNTH_TRUTH.csv) to out_dir; seconds in the summary."""
    cfg = SynthConfig(patients=patients, seed=seed, trigger_offset_seconds=trigger_offset_seconds,
                      dialect=dialect, gzip=gzip, events_scale=events_scale, compresslevel=compresslevel,
                      dictionary_dir=pathlib.Path(dictionary_dir) if dictionary_dir else None, site=site,
                      plant_subgroup=plant_subgroup, truth=truth)
    return write_release(cfg, pathlib.Path(out_dir), show_progress)


def write_release(cfg: SynthConfig, out_dir: pathlib.Path, show_progress: bool = True, *,
                  overwrite: bool = False) -> SynthSummary:
    """Writes the release a config describes, whole or not at all; byte-identical for equal configs.

    An earlier release in out_dir is replaced only with ``overwrite`` (output_folder.staged).
    """
    t0 = time.perf_counter()
    inputs = [cfg.dictionary_dir] if cfg.dictionary_dir else []
    with output_folder.staged(out_dir, kind=output_folder.SYNTHETIC_RELEASE, command="ehr-pipeline synth",
                              overwrite=overwrite, inputs=inputs) as staging:
        summary = _write_release(cfg, pathlib.Path(staging), show_progress, t0)
    summary = dataclasses.replace(summary, out_dir=pathlib.Path(out_dir))
    log.info("%s", summary.format())
    return summary


def _write_release(cfg: SynthConfig, out_dir: pathlib.Path, show_progress: bool, t0: float) -> SynthSummary:
    """write_release's work, written into out_dir (the staging folder)."""
    model = release_model(cfg)
    site = SITES[cfg.site]
    ids = IdBase(SUBJECT_ID_BASE + site.id_offset, HADM_ID_BASE + site.id_offset,
                 ICUSTAY_ID_BASE + site.id_offset)
    admissions = deaths = long_adm = long_deaths = 0
    bar = tqdm(total=cfg.patients, unit="patient", desc="synth", leave=False,
               disable=not (show_progress and sys.stderr.isatty()))
    with ReleaseWriter(out_dir, cfg.dialect, cfg.gzip, cfg.compresslevel) as w, bar:
        w.open_extra(TRUTH_FILE, TRUTH_FILE, TRUTH_COLUMNS)
        for name, table in dictionaries(cfg.dictionary_dir, site).items():
            w.append(name, table)
        for chunk_index, first in enumerate(range(0, cfg.patients, CHUNK_PATIENTS)):
            n = min(CHUNK_PATIENTS, cfg.patients - first)
            chunk = generate_chunk(cfg, chunk_index, n, ids, model)
            for name, table in chunk.tables.items():
                w.append(name, table)
            w.append_extra(TRUTH_FILE, chunk.truth)
            ids = IdBase(ids.subject + n, ids.hadm + chunk.n_admissions, ids.icustay + chunk.n_admissions)
            admissions += chunk.n_admissions
            deaths += chunk.n_deaths
            long_adm += chunk.n_long
            long_deaths += chunk.n_long_deaths
            bar.update(n)
        rows = w.rows()
    _write_manifest(out_dir / MANIFEST_FILE, cfg, site, model, rows)
    summary = SynthSummary(
        out_dir=out_dir, patients=cfg.patients, admissions=admissions, deaths=deaths,
        long_admissions=long_adm, long_deaths=long_deaths,
        rows={t: rows.get(t, 0) for t in [*table_schemas.TABLES, TRUTH_FILE]},
        events=sum(rows.get(t, 0) for t in EVENT_TABLES), seconds=time.perf_counter() - t0)
    return summary


def dictionaries(dictionary_dir: pathlib.Path | None, site: Site) -> dict[str, pa.Table]:
    """D_ITEMS and D_LABITEMS (minus ROW_ID): a real release's rows first if given, then the site's."""
    builtin = {"D_ITEMS": site.d_items_rows(), "D_LABITEMS": site.d_labitems_rows()}
    real = catalog.load_dictionaries(dictionary_dir) if dictionary_dir is not None else {}
    out = {}
    for name, cols in builtin.items():
        schema = table_schemas.TABLES[name]
        n = len(cols["ITEMID"])
        table = pa.table({c.name: pa.array(cols[c.name], catalog.arrow_type(c.type)) if c.name in cols
                          else pa.nulls(n, catalog.arrow_type(c.type))
                          for c in schema.columns if c.name != "ROW_ID"})
        if name in real:
            # The real dictionary wins for items it knows (its labels and units are the truth).
            base = real[name].drop_columns(["ROW_ID"])
            known = set(base.column("ITEMID").to_pylist())
            mine = [i not in known for i in cols["ITEMID"]]
            table = pa.concat_tables([base, table.filter(pa.array(mine))])
        out[name] = table
    return out


def _write_manifest(path: pathlib.Path, cfg: SynthConfig, site: Site, model: MortalityModel | TemporalModel,
                    rows: dict) -> None:
    # Only inputs that determine the bytes go in (no timings, no paths): the manifest is
    # itself byte-identical for equal configs.
    linear = model.linear if isinstance(model, TemporalModel) else model
    doc = {
        "generator": "ehr_pipeline.synth", "version": ehr_base.__version__,
        "patients": cfg.patients, "seed": cfg.seed, "chunk_patients": CHUNK_PATIENTS,
        "trigger_offset_seconds": cfg.trigger_offset_seconds, "dialect": cfg.dialect, "gzip": cfg.gzip,
        "events_scale": cfg.events_scale, "compresslevel": cfg.compresslevel,
        "dictionary_enriched": cfg.dictionary_dir is not None,
        # The coefficients this release's truth used: the site's truth applied (sites D and E
        # differ from site A's), the temporal family's linear part.
        "site": site.describe(), "mortality_model": dataclasses.asdict(linear), "rows": rows,
    }
    if cfg.plant_subgroup is not None:  # absent otherwise, so default manifests keep their bytes
        doc["planted_subgroup"] = {"admission_type": cfg.plant_subgroup, "terms": list(PLANTED_TERMS),
                                   "factor": PLANTED_FACTOR}
    if isinstance(model, TemporalModel):  # likewise: no "truth" entry means the linear family
        doc["truth"] = {"family": cfg.truth, **model.describe()}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
