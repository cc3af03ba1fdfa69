"""The job's manifest: what went in, what came out, and where every record went.

The manifest is deterministic (no wall-clock times, no host names) so two runs on the same
input produce byte-identical output folders; run timing goes to ``run_info.json``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ehr_pipeline.contract import SPLIT_NAMES, layout, spec
from ehr_pipeline.encode import previous_stay, units
from ehr_pipeline.mimic.events import DUPLICATE_ROW_ID

MANIFEST_VERSION = 1


def group(counts: Mapping[str, int], prefix: str) -> dict[str, int]:
    """Sub-dict of flat counts under 'prefix/' with the prefix stripped."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in sorted(counts.items()) if k.startswith(prefix + "/")}


def table_accounting(counts: Mapping[str, int], table: str) -> dict[str, Any]:
    """Every row of an event table, from read to used, with the invariants checked."""
    rows = group(counts, f"rows/{table}")
    dead = group(counts, f"rows/{table}/dead_letter")
    extract = group(counts, f"events/{table}/extract")
    cohort = group(counts, f"events/{table}/cohort")
    read, parsed = rows.get("read", 0), rows.get("parsed", 0)
    kept = extract.get("kept", 0)
    problems = []
    if read != parsed + sum(dead.values()):
        problems.append(f"rows read {read} != parsed {parsed} + dead-lettered {sum(dead.values())}")
    if parsed != sum(extract.values()):
        problems.append(f"rows parsed {parsed} != events extracted/dropped {sum(extract.values())}")
    if kept != sum(cohort.values()):
        problems.append(f"events kept {kept} != used + filtered {sum(cohort.values())}")
    return {
        "rows_read": read,
        "rows_parsed": parsed,
        "dead_lettered": dead,
        "extract": extract,
        "cohort_filter": cohort,
        "balanced": not problems,
        "problems": problems,
    }


def build_manifest(*, out_dir, config, counts, tables, cohort_counts, input_doc, vocabulary, labels=None,
                   previous_discharge_counts=None, seconds=None, runner=None) -> dict[str, Any]:
    """Assembles the manifest from the job's counts and the files it wrote (checksummed).

    ``tables``: per input table its accounting (``table_accounting``); ``cohort_counts``: the
    built-in task's outcome per admission (kept or the exclusion reason); ``labels``: with a
    MEDS label file, what became of its rows; ``previous_discharge_counts``: the examples with and
    without a previous discharge, and those with an earlier stay skipped (``encode.previous_stay.COUNTS``).
    """
    del seconds, runner  # deliberately not in the manifest: see module docstring
    cfg = config.to_dict()
    split_info = {}
    for split in SPLIT_NAMES:
        n_shards = cfg["num_shards"][split]
        files = {}
        for shard in range(n_shards):
            name = spec.shard_file_name(split, shard, n_shards)
            files[name] = {"sha256": layout.sha256_of(layout.join(out_dir, name))}
        examples = counts.get(f"examples/{split}/written", 0)
        positives = counts.get(f"examples/{split}/positive", 0)
        split_info[split] = {
            "examples": examples,
            "positives": positives,
            "label_rate": positives / examples if examples else None,
            "records_written": counts.get(f"files/{split}/records_written", 0),
            "files": files,
        }
    doc = {
        "manifest_version": MANIFEST_VERSION,
        "schema_version": spec.SCHEMA_VERSION,
        "input": dict(input_doc),
        "config": cfg,
        "cohort": {"admissions": sum(cohort_counts.values()), "counts": dict(sorted(cohort_counts.items())),
                   "previous_discharge": {k: int((previous_discharge_counts or {}).get(k, 0))
                                          for k in previous_stay.COUNTS}},
        "tables": dict(tables),
        "bagging": group(counts, "bagging"),
        "splits": split_info,
        "vocabulary": {"file": layout.VOCABULARY, "sizes": {s: len(v) for s, v in vocabulary.items()},
                       "sha256": layout.sha256_of(layout.join(out_dir, layout.VOCABULARY))},
        "numeric_stats": {"file": layout.NUMERIC_STATS,
                          "sha256": layout.sha256_of(layout.join(out_dir, layout.NUMERIC_STATS))},
        "lab_loinc": {"file": layout.LAB_LOINC,
                      "sha256": layout.sha256_of(layout.join(out_dir, layout.LAB_LOINC))},
        "units": {"file": layout.UNITS, "sha256": layout.sha256_of(layout.join(out_dir, layout.UNITS)),
                  "values": _units_by_source(counts)},
        "dead_letters": {t: sum(v["dead_lettered"].values()) for t, v in tables.items()},
        "balanced": all(v["balanced"] for v in tables.values()) and (labels is None or labels["balanced"]),
    }
    if labels is not None:
        doc["labels"] = labels
    if layout.exists(layout.join(out_dir, layout.MEDS_CODES)):
        doc["meds_codes"] = {"file": layout.MEDS_CODES,
                             "sha256": layout.sha256_of(layout.join(out_dir, layout.MEDS_CODES))}
    return doc


def _units_by_source(counts: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """What happened to the bagged numeric values per source: 'lab' -> {'same_unit': n, 'converted': n, ...}."""
    out: dict[str, dict[str, int]] = {}
    for key, n in group(counts, "units").items():
        source, outcome = key.split("/", 1)
        out.setdefault(source, {})[outcome] = n
    return {s: dict(sorted(v.items())) for s, v in sorted(out.items())}


# How the summary names the outcomes of values set aside for their unit, beside 'not convertible'.
_NOT_USED_NAMES = ((units.AMBIGUOUS, "in an ambiguous unit"), (units.PLACEHOLDER, "with a placeholder for a unit"),
                   (units.IMPLAUSIBLE, "implausibly far from the training median once converted"))


def _unit_line(source: str, v: Mapping[str, int]) -> str:
    """One source's converted and set-aside values, or '' when there are none."""
    if not any(v.get(k) for k in (units.CONVERTED, *units.NOT_USED)):
        return ""
    others = "".join(f", {v[o]:,} {name}" for o, name in _NOT_USED_NAMES if v.get(o))
    return (f"{source} values: {v.get(units.CONVERTED, 0):,} converted to their code's canonical unit, "
            f"{v.get(units.NOT_CONVERTIBLE, 0):,} not convertible{others} (not used; "
            f"dead_letter/values_not_convertible.jsonl)")


def _repeat_line(table: str, t: Mapping[str, Any]) -> str:
    """One table's rows that repeat a ROW_ID (counted among 'filtered'), or '' when there are none."""
    n = t.get("cohort_filter", {}).get(DUPLICATE_ROW_ID, 0) or t.get("extract", {}).get(DUPLICATE_ROW_ID, 0)
    if not n:
        return ""
    return (f"{table}: {n:,} rows repeat a ROW_ID read before in the table (not used; "
            f"dead_letter/{table}.{DUPLICATE_ROW_ID}.jsonl)")


def format_manifest_summary(manifest: Mapping[str, Any]) -> str:
    """A human-readable summary of a manifest, for the CLI and the demo."""
    lines = []
    coh = manifest["cohort"]
    lines.append(f"cohort: {coh['counts'].get('kept', 0)} of {coh['admissions']} admissions kept")
    for reason, n in coh["counts"].items():
        if reason != "kept" and n:
            lines.append(f"  excluded {reason:<28} {n:>8}")
    lines.append("")
    lines.append(f"{'table':<16}{'rows read':>12}{'dead':>8}{'events used':>14}{'filtered':>12}")
    for table, t in manifest["tables"].items():
        cf = t.get("cohort_filter", {})
        used = cf.get("used", "")
        filtered = sum(v for k, v in cf.items() if k != "used") + sum(
            v for k, v in t.get("extract", {}).items() if k != "kept") if cf else ""
        lines.append(f"{table:<16}{t['rows_read']:>12,}{sum(t['dead_lettered'].values()):>8}"
                     f"{used if used == '' else format(used, ','):>14}"
                     f"{filtered if filtered == '' else format(filtered, ','):>12}")
    repeats = [_repeat_line(table, t) for table, t in manifest["tables"].items()]
    if any(repeats):
        lines.append("")
        lines.extend(line for line in repeats if line)
    lines.append("")
    lines.append(f"{'split':<12}{'examples':>10}{'deaths':>8}{'rate':>8}")
    for split, s in manifest["splits"].items():
        rate = "" if s["label_rate"] is None else f"{s['label_rate']:.3f}"
        lines.append(f"{split:<12}{s['examples']:>10}{s['positives']:>8}{rate:>8}")
    values = manifest.get("units", {}).get("values") or {}
    unit_lines = [_unit_line(source, v) for source, v in values.items()]
    if any(unit_lines):
        lines.append("")
        lines.extend(line for line in unit_lines if line)
    sizes = manifest["vocabulary"]["sizes"]
    lines.append("")
    lines.append("vocabulary: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    lines.append(f"every record accounted for: {'yes' if manifest['balanced'] else 'NO'}")
    return "\n".join(lines)
