"""The TRIPOD+AI items a report states from what the tool knows, or marks for the user to state.

Items 10 (sample size), 14 (fairness approach), 16 (training against evaluation data), 17 (ethics and
data access), 18 (open science) and 27 (unavailable inputs) of Collins et al. (BMJ 2024). Each is
one short paragraph read from the metrics.json / comparison.json the page renders (population,
model cards, subgroups, the data manifest's checksum): nothing is recomputed. What only the user
knows (an ethics approval, a registration) is written as "for the user to state", never guessed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from model.evaluation.report.html_cells import esc, num, pct, section
from model.evaluation.statistics.small_sample import PRECISE_EVENTS

USER = '<b class="user">For the user to state:</b>'
# What the model does with inputs it cannot read (model.ehr.inputs and the data folder's bagging).
UNKNOWN_CODES = ("A code outside the training vocabulary is read as its source's out-of-vocabulary token (one per "
                 "source, one for an unknown source); a source with no event before the prediction time adds no "
                 "bag, and the model reads the shorter sequence; no value is imputed")


def _splits(doc: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    return (doc.get("population") or {}).get("splits") or {}


def sample_size(doc: Mapping[str, Any], parameters: Sequence[tuple[str, int | None, str]]) -> str:
    """Item 10: the events the data had for training and evaluation, and events per parameter ((label, count,
    unit): "parameter" for a network, "candidate feature" for a baseline)."""
    splits = _splits(doc)
    train = (splits.get("train") or {}).get("events")
    events = int(round(doc["n"] * doc["prevalence"])) if "prevalence" in doc else None
    evaluated = (f"Evaluated on {num(doc['n'])} cases with {num(events)} deaths" if events is not None
                 else f"Evaluated on {num(doc['n'])} paired cases")
    text = (f"<p>The sample size was not chosen: it is what the data folder held. {evaluated}; a validation needs "
            f"at least {PRECISE_EVENTS} deaths and {PRECISE_EVENTS} survivors for precise estimates (Riley et al. "
            "2021).")
    per = [f"{esc(label)}: {num(count)} {esc(unit)}s"
           + (f", {train / count:.2g} deaths per {esc(unit)}" if train is not None else "")
           for label, count, unit in parameters if count]
    if train is not None:
        text += f" The train split had {num(train)} deaths" + ("; " + "; ".join(per) if per else "") + "."
    elif per:
        text += " " + "; ".join(per) + " (the train split's deaths are not in this file)."
    return text + "</p>"


def fairness(subgroups: Sequence[tuple[str, Mapping[str, Any] | None]], absent: Sequence[str]) -> str:
    """Item 14: the subgroup analyses done (attributes, metrics, multiplicity) and the groups absent."""
    parts = []
    for label, sub in subgroups:
        if not sub:
            continue
        prefix = f"{esc(label)}: p" if len(subgroups) > 1 else "P"
        attributes = esc(", ".join(a.replace("_", " ") for a in sub["attributes"]))
        tested = (f"{sub['comparisons']} Bonferroni-adjusted comparisons of groups with at least "
                  f"{sub['min_gap_cases']} cases" if sub["comparisons"] else
                  f"no group reached the {sub['min_gap_cases']} cases a comparison needs")
        parts.append(f"{prefix}erformance compared after the fact across {attributes} ({tested})")
    if not parts:
        return "<p>No subgroup analysis: the file records no case attributes.</p>"
    missing = f" Groups with no case in these data, so not assessed: {esc(', '.join(absent))}." if absent else ""
    return (f"<p>{'; '.join(parts)}. Ethnicity and insurance are recorded for this analysis only and are not model "
            f"inputs; no fairness constraint or reweighting is applied by this tool.{missing}</p>")


def data_differences(doc: Mapping[str, Any], training_sha: Sequence[str | None], evaluated_sha: str | None) -> str:
    """Item 16: whether the evaluated data folder is the one the model was trained on (manifest checksums), and
    the shift report's level where there is one."""
    known = [s for s in training_sha if s]
    if not known or not evaluated_sha:
        same = "The training data's identity is not recorded in this file for every model"
    elif all(s == evaluated_sha for s in known):
        same = (f"Same data folder as training (manifest sha256 {esc(evaluated_sha[:12])}): the evaluated split's "
                "patients are disjoint from the training ones; same source, period and site")
    else:
        same = (f"A different data folder from training (trained on manifest sha256 "
                f"{esc(', '.join(sorted({s[:12] for s in known})))}, evaluated on {esc(evaluated_sha[:12])})")
    shift = doc.get("shift")
    level = f"; the shift report against the training population: level {esc(shift['level'])}" if shift else ""
    return f"<p>{same}{level}.</p><p>{USER} differences in setting, time or care that the data do not record.</p>"


def ethics(dataset: str | None) -> str:
    """Item 17: ethics approval, consent and data access are the user's to state."""
    name = f" ({esc(dataset)})" if dataset else ""
    return (f"<p>{USER} the ethics approval or waiver, consent, and the data access terms{name} under which these "
            "data were used.</p>")


def open_science(version: str | None, settings: str, checksums: Sequence[str]) -> str:
    """Item 18: the software version, the configuration, the export checksums; registration for the user."""
    sums = ", ".join(c[:12] for c in checksums if c) or "none (no export)"
    return (f"<p>Software: ehr-eval {esc(version or 'version not recorded')}; configuration: each export's "
            f"model_card.json holds its training configuration; this evaluation: {esc(settings)}; export sha256 "
            f"{esc(sums)}. {USER} the registration and where code and data can be obtained.</p>")


def unavailable_inputs(doc: Mapping[str, Any]) -> str:
    """Item 27: what the model does with unknown codes and absent sources, and how often sources were absent."""
    split = _splits(doc).get(doc.get("split", "test")) or {}
    missing = split.get("missing_source") or {}
    counts = "; ".join(f"no {esc(src)} event {pct(share)}" for src, share in sorted(missing.items()))
    none = (split.get("bags") or {}).get("none")
    counted = (f" In the evaluated split: {counts}" + (f"; no event at all {pct(none)}" if none is not None else "")
               + "." if counts else " This file records no per-source counts (no data folder was given).")
    unknown = split.get("unknown_codes")
    if unknown is not None:
        rows = [f"{esc(src)} {row['unknown']:,} of {row['events']:,} ({pct(row['share'])}, {row['unknown_codes']:,} "
                f"distinct code{'s' if row['unknown_codes'] != 1 else ''})" for src, row in sorted(unknown.items())]
        counted += (" Events whose code the model does not know: " + "; ".join(rows) + "." if rows
                    else " The evaluated split has no event.")
    return f"<p>{esc(UNKNOWN_CODES)}.{counted}</p>"


def section_html(doc: Mapping[str, Any], *, parameters: Sequence[tuple[str, int | None, str]],
                 subgroups: Sequence[tuple[str, Mapping[str, Any] | None]], absent: Sequence[str],
                 training_sha: Sequence[str | None], evaluated_sha: str | None, version: str | None,
                 settings: str, checksums: Sequence[str]) -> str:
    """The page's section of items 10, 14, 16, 17, 18 and 27, each under its number."""
    dataset = ((doc.get("population") or {}).get("dataset") or {}).get("name")
    items = (("10", "Sample size", sample_size(doc, parameters)), ("14", "Fairness", fairness(subgroups, absent)),
             ("16", "Training and evaluation data", data_differences(doc, training_sha, evaluated_sha)),
             ("17", "Ethics and data access", ethics(dataset)),
             ("18", "Open science", open_science(version, settings, checksums)),
             ("27", "Unavailable inputs", unavailable_inputs(doc)))
    body = "".join(f"<h3>{esc(title)} <span class=\"item\">({esc(item)})</span></h3>{text}"
                   for item, title, text in items)
    return section("Methods the page states or leaves to the user", "10, 14, 16, 17, 18, 27", body)
