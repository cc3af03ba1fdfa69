"""The page's design sections: who was evaluated (TRIPOD+AI 20a-c), the numbers in each analysis (21), the
model's specification (22) and the inputs the data actually had; rendered from metrics.json, computing nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from model.evaluation.report import report_summary
from model.evaluation.report.html_cells import esc as _esc, num as _num, pct as _pct
from model.evaluation.report.html_cells import section as _section, table as _table


def participants(population: Mapping[str, Any] | None) -> str:
    if not population:
        return _section("Participants", "20a-c", '<p class="note">No data folder was given (a comparison of two '
                                                  'predictions files): the cases are described in the reports '
                                                  'that wrote them.</p>')
    cohort = population["cohort"]
    rows = [["ADMISSIONS rows read", _num(cohort.get("admissions"))]]
    rows += [[f"excluded: {reason.replace('_', ' ')}", _num(n)] for reason, n in cohort.get("excluded", {}).items()]
    rows.append(["kept: adult admissions alive and in hospital at the prediction time", _num(cohort.get("kept"))])
    splits = population.get("splits", {})
    for name, s in splits.items():
        rows.append([f"  {name} split", f"{_num(s.get('n'))} ({_num(s.get('events'))} deaths)"])
    settings = population.get("settings", {})
    offset = settings.get("trigger_offset_seconds")
    flow = _table(["Cohort", "admissions"], rows)
    fractions = ", ".join(f"{name} {_pct(f, 0)}" for name, f in (settings.get("splits") or {}).items()
                          if isinstance(f, (int, float)))
    intro = (f"<p>Prediction time: admission + {offset / 3600:g} h; outcome: in-hospital death after it. "
             f"Minimum age {_num(settings.get('min_age_years'), 0)} years. Patients assigned to splits at random "
             f"({_esc(fractions)}), so an admission's split is its patient's.</p>" if offset else "")
    names = list(splits)
    chars = []

    def add(label: str, fn):
        chars.append([label] + [fn(splits[n]) if splits[n].get("n") else "n/a" for n in names])

    add("admissions", lambda s: _num(s["n"]))
    add("deaths (outcome rate)", lambda s: f"{_num(s['events'])} ({_pct(s['outcome_rate'])})")
    add("prediction times (shifted dates)", lambda s: f"{s['period']['first_prediction']} to "
                                                      f"{s['period']['last_prediction']}")
    add("age, median (IQR), years", lambda s: f"{s['age_years']['median']:.0f} ({s['age_years']['q1']:.0f}-"
                                              f"{s['age_years']['q3']:.0f})")
    for attribute in ("sex", "admission_type", "ethnicity", "insurance"):
        groups = sorted({g for n in names for g in splits[n].get(attribute, {})})
        for g in groups:
            add(f"{attribute.replace('_', ' ')}: {g}", lambda s, a=attribute, g=g: _pct(s.get(a, {}).get(g, 0.0)))
    add("time bags before prediction, median", lambda s: _num(s["bags"]["median"], 0))
    add("no event at all before prediction", lambda s: _pct(s["bags"]["none"]))
    sources = sorted({src for n in names for src in splits[n].get("missing_source", {})})
    for src in sources:
        add(f"missing: no {src} event before prediction", lambda s, src=src: _pct(s["missing_source"].get(src)))
    table_rows = [[t, _num(v.get("rows_read")), _num(v.get("dead_lettered")), _num(v.get("events_used"))]
                  for t, v in population.get("tables", {}).items()]
    bagging = population.get("bagging", {})
    events = _table(["Table", "rows read", "unreadable (dead-lettered)", "events used (before prediction)"],
                    table_rows)
    body = (report_summary.dataset_paragraph(population) + intro + "<h3>Flow of admissions (20a)</h3>" + flow
            + "<h3>Characteristics per split (20b, 20c)</h3>" + _table(["Characteristic"] + names, chars)
            + '<p class="note">Ethnicity is pooled from ADMISSIONS.ETHNICITY into broad groups; ethnicity and '
              "insurance are recorded for this report only and are not model inputs.</p>"
            + "<h3>Events read and used</h3>" + events
            + (f"<p>Bagging: {_num(bagging.get('events_in'))} events in, {_num(bagging.get('used'))} used.</p>"
               if bagging else ""))
    return _section("Participants: who the model was built and tested on", "20a-c", body)


def analysis_numbers(population: Mapping[str, Any] | None, doc: Mapping[str, Any]) -> str:
    splits = (population or {}).get("splits", {})
    purpose = {"train": "fitting the model", "validation": "early stopping, the referral threshold",
               "test": "this report" if doc.get("split", "test") == "test" else "held out"}
    if doc.get("split") and doc["split"] != "test":
        purpose[doc["split"]] = purpose.get(doc["split"], "") + " (this report)"
    rows = [[name, purpose.get(name, ""), _num(s.get("n")), _num(s.get("events"))] for name, s in splits.items()]
    if not rows:
        return ""
    return _section("Participants and outcome events in each analysis", "21",
                    _table(["Split", "used for", "admissions", "deaths"], rows, left=2))


SOURCE_NAMES = {"lab": "labs", "chart": "charted observations (vital signs)", "input": "inputs",
                "output": "outputs", "prescription": "prescriptions", "diagnosis": "earlier admissions' diagnoses",
                "procedure": "earlier admissions' procedures"}


def input_sources(population: Mapping[str, Any] | None) -> str:
    """' (labs, ...)' from the sources the data's splits actually hold, and which it had none of."""
    splits = (population or {}).get("splits") or {}
    missing = [s.get("missing_source") or {} for s in splits.values() if s.get("n")]
    sources = sorted({src for m in missing for src in m})
    if not sources:
        return " (the data folder's sources are not recorded in this file)"
    held = [src for src in sources if any(m.get(src, 1.0) < 1.0 for m in missing)]
    none = [src for src in sources if src not in held]
    text = " (" + ", ".join(SOURCE_NAMES.get(s, s) for s in held) + ")"
    return text + (f"; this data had no {', '.join(SOURCE_NAMES.get(s, s) for s in none)} events at all"
                   if none else "")


def specification(doc: Mapping[str, Any]) -> str:
    model = doc.get("model") or {}
    members = model.get("members") or []
    rows = []
    for m in members:
        config = m.get("config") or {}
        arch = config.get("model") or {}
        keys = ("method", "ensemble_size", "embedding_dim", "rnn_dim", "hidden_layer_dim", "pooling", "wide",
                "wide_posterior", "distribution")
        rows.append([m.get("name", "?"), ", ".join(f"{k}={arch[k]}" for k in keys if k in arch) or m.get("method", ""),
                     _num(m.get("num_parameters")), m.get("version", "")])
    parts = []
    if rows:
        parts.append(_table(["Model", "specification", "parameters", "version"], rows, left=2))
        parts.append(f'<p class="note">Inputs: age, sex, admission type and the time-bagged events before the '
                     f"prediction time{_esc(input_sources(doc.get('population')))}. The full configuration is in "
                     "each export's model_card.json.</p>")
        use = members[0].get("intended_use")
        if use:
            parts.append(f"<p><b>Intended use.</b> {_esc(use)}</p><p><b>Limitations.</b> "
                         f"{_esc(members[0].get('limitations', ''))}</p>")
    if doc.get("baseline"):
        b = doc["baseline"]
        parts.append(f"<p>Baseline: {_esc(b['kind'])} on {_num(b.get('num_features'))} bag aggregates, settings "
                     f"chosen on validation: {_esc(b.get('params'))}.</p>")
    r = doc.get("referral")
    if r:
        parts.append(f"<p>Referral rule: refer when {_esc(r['measure'])} &gt; {_num(r['threshold'], 4)} (chosen on "
                     f"the validation split to refer at most {_pct(r['rate'], 0)}).</p>")
    return _section("Model specification", "22", "".join(parts))
