"""Reading a unit as written: blank, a placeholder, a UCUM code, ambiguous, or text that is no unit.

UCUM is case-sensitive ("mU" is milli-units, "MU" mega-units, "mu" milli-daltons), but lab
exports are not: many write every unit in capitals ("MG/DL", "MU/L"), some in lower case. So a
unit string is read in this order, and the first rule that applies decides (``read``):

1. Blank (nothing but whitespace): no unit.
2. A placeholder (``PLACEHOLDERS``: "N/A", "NULL", "none", "unknown", or only filler marks such
   as "-", "?", "..."): an export's way of writing that there is no unit. Never parsed: the UCUM
   grammar reads "N/A" as newton per ampere.
3. A UCUM code written exactly as a common one (``KNOWN_UCUM``), or a known non-UCUM spelling of
   MIMIC-III and EHR exports (``SPELLINGS``, case-insensitive: "mEq/L", "K/uL", "mm Hg", and
   CareVue's "Deg. F", "BPM", "mcgkgmin"), or a label MIMIC-III writes in a unit column that is
   no unit (``NOT_UNITS``: "units", "dose", "TAB", "DEV"): text, never parsed, since the grammar
   reads "DEV" as decielectronvolts.
4. Atom by atom: each run of letters (with its bracketed part, "m[IU]") is looked up,
   case-insensitively, in a lexicon of the atoms clinical units use (``ATOMS``): "MG" is mg, "DL"
   is dL, "KPA" is kPa. A folded atom with two clinical readings ("mu": milli-units or
   mega-units, as pharmacies write penicillin in MU; "miu": milli- or million IU) is taken as
   written only when the atom itself shows its case ("mU", "mIU"); in one case ("MU", "mu") it is
   **ambiguous**: no conversion is guessed from it.
   Before the atoms are looked up, the words clinical units are written with are made UCUM's:
   "cmH2O" and "mmHg" inside a longer unit ("mL/cmH2O") are bracketed, "*" between atoms is
   UCUM's "." ("dynes*sec/cm5"), and an abbreviation's dot before "/" is dropped ("mEq./hour").
5. An atom outside the lexicon is read as written when the string shows case (upper and lower
   letters: "mV", "Gy"): its writer used UCUM's case. In one case, every case variant of the atom
   is tried with the grammar: one meaning ("K" can only be kelvin) is read; two or more ("PA":
   pascal, peta-ampere or pico-ampere; "MS") are ambiguous; none is text.
6. Anything that does not then parse is text ("units", "dose", "see comment"): no unit this
   module reads; it still matches itself.

Pure and cheap: the grammar is injected as ``meaning`` (the converter's, which loads pint on the
first string that needs it).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Hashable

# What a unit string is (every string is exactly one).
BLANK = "blank"
PLACEHOLDER = "placeholder"
UCUM = "ucum"
AMBIGUOUS = "ambiguous"
TEXT = "text"

# Common non-UCUM spellings -> UCUM, looked up case-insensitively after whitespace is collapsed
# and the micro signs (U+00B5, U+03BC) are read as "u". MIMIC-III writes "?" for the degree sign.
# "IU/L" is MIMIC's spelling for enzyme activities (ALT, AST, ALP, LD, CK, lipase, amylase):
# an enzyme's international unit IS the enzyme unit U = 1 umol/min (IUB 1961), whereas UCUM's
# [IU] is an arbitrary unit (hormones, vitamins) that converts to nothing but itself.
# MIMIC's bare "units" is left out on purpose: it means pH units for labs and international
# units for drugs, so it has no one UCUM code (it still matches itself, see units.Converter.key).
# No entry may hide a case ambiguity: "mIU/mL" is read atom by atom (rule 4), not here.
SPELLINGS: dict[str, str] = {
    "meq/l": "meq/L", "meq": "meq", "meq.": "meq", "mmol/l": "mmol/L", "umol/l": "umol/L",
    "iu/l": "U/L", "u/l": "U/L", "iu/ml": "[IU]/mL", "uiu/ml": "u[IU]/mL", "uu/ml": "u[IU]/mL",
    "eu/dl": "[EU]/dL", "u/g/hb": "U/g{Hb}",
    "k/ul": "10*3/uL", "k/mm3": "10*3/mm3", "thou/ul": "10*3/uL", "x10^3/ul": "10*3/uL", "10^3/ul": "10*3/uL",
    "x10e3/ul": "10*3/uL", "10e3/ul": "10*3/uL", "x10*3/ul": "10*3/uL", "m/ul": "10*6/uL", "x10^6/ul": "10*6/uL",
    "10^6/ul": "10*6/uL", "x10*6/ul": "10*6/uL",
    "x10^9/l": "10*9/L", "10^9/l": "10*9/L", "x10e9/l": "10*9/L", "10e9/l": "10*9/L", "x10*9/l": "10*9/L",
    "x10^12/l": "10*12/L", "10^12/l": "10*12/L", "x10e12/l": "10*12/L", "x10*12/l": "10*12/L",
    "#/ul": "/uL", "cells/ul": "/uL", "#/mm3": "/mm3", "cells/mm3": "/mm3",
    "#/hpf": "/[HPF]", "/hpf": "/[HPF]", "#/lpf": "/[LPF]", "/lpf": "/[LPF]",
    "mm hg": "mm[Hg]", "mmhg": "mm[Hg]", "cmh2o": "cm[H2O]", "cm h2o": "cm[H2O]",
    "sec": "s", "secs": "s", "seconds": "s", "min": "min", "hr": "h", "hrs": "h", "hours": "h",
    "ratio": "{ratio}", "mosm/kg": "mosm/kg", "mosm/l": "mosm/L",
    "ml": "mL", "cc": "mL", "l": "L", "mcg": "ug", "gm": "g", "gms": "g", "grams": "g", "gram": "g",
    "mg": "mg", "kg": "kg", "lb": "[lb_av]", "lbs": "[lb_av]", "in": "[in_i]", "inch": "[in_i]", "inches": "[in_i]",
    "cm": "cm", "mmol": "mmol", "mol": "mol",
    "bpm": "/min", "beats/min": "/min", "breaths/min": "/min", "insp/min": "/min", "/min": "/min",
    "?c": "Cel", "?f": "[degF]", "°c": "Cel", "°f": "[degF]", "deg c": "Cel", "deg f": "[degF]",
    "degc": "Cel", "degf": "[degF]", "c": "Cel", "f": "[degF]",
    "mm/hr": "mm/h", "mg/24hr": "mg/(24.h)", "ml/hr": "mL/h", "ml/min": "mL/min", "l/min": "L/min",
    "mcg/ml": "ug/mL", "mcg/dl": "ug/dL", "mcg/l": "ug/L", "mcg/kg/min": "ug/kg/min",
    "mg%": "mg/dL", "mg %": "mg/dL", "g%": "g/dL", "g %": "g/dL", "gpt/l": "10*9/L", "tpt/l": "10*12/L",
    "ml/min/1.73m2": "mL/min/{1.73_m2}", "ml/min/1.73 m2": "mL/min/{1.73_m2}", "ml/min/1.73m^2": "mL/min/{1.73_m2}",
    "ph": "[pH]",  # read as written, 'pH' is the picohenry
    # MIMIC-III's own spellings: the CareVue chart units, the demo's D_ITEMS.UNITNAME and the
    # VALUEUOM / AMOUNTUOM / RATEUOM of every table. CareVue writes temperatures 'Deg. F' (item
    # 678) and 'Deg. C' (item 676): atom by atom they are no unit as written, and 'deg. f' in one
    # case is the degree (angle) times the farad, so they must be spelled here.
    "deg. f": "[degF]", "deg.f": "[degF]", "deg. c": "Cel", "deg.c": "Cel", "degrees f": "[degF]",
    "degrees c": "Cel", "degrees fahrenheit": "[degF]", "degrees celsius": "Cel", "fahrenheit": "[degF]",
    "celsius": "Cel", "\u00baf": "[degF]", "\u00bac": "Cel",
    "degree": "deg", "degrees": "deg",  # MetaVision's head-of-bed angle (item 226170)
    "cmh20": "cm[H2O]", "cm h20": "cm[H2O]", "lpm": "L/min",
    "mcgkgmin": "ug/kg/min", "mcgkghr": "ug/kg/h", "mcgmin": "ug/min", "mcghr": "ug/h", "mgkgmin": "mg/kg/min",
    "mgkghr": "mg/kg/h", "mgmin": "mg/min", "mghr": "mg/h", "uhr": "U/h", "umin": "U/min",  # CareVue rates
    "ml sc": "mL{SC}",  # lidocaine given subcutaneously (items 224491, 224505, 225257)
    "ml/beat": "mL/{beat}", "ml/b": "mL/{beat}", "international units": "[IU]",
    "ppm": "[ppm]", "psi": "[psi]", "year": "a", "years": "a", "yrs": "a",
    # Airway resistance is cmH2O per (L/s); read atom by atom the string would be cmH2O per L per s.
    "cmh2o/l/seconds": "cm[H2O].s/L", "cmh2o/l/sec": "cm[H2O].s/L", "cmh2o/l/s": "cm[H2O].s/L",
}
# Labels MIMIC-III writes in unit columns that are no unit of measure, folded: lab answers ('+/-',
# 'Pos/Neg'), counts of dosage
# forms (PRESCRIPTIONS' TAB, VIAL, PUFF...), 'units' (pH units for labs, international units for
# drugs: no one UCUM code), MetaVision's 'dose', DATETIMEEVENTS' 'Date', 'mg PE' (phenytoin
# equivalents, not milligrams) and 'ounces' (of mass or of volume, the string does not say).
# Read as text without the grammar, which makes units of some ('DEV' decielectronvolts, 'KIT'
# kibitesla); each still matches itself.
NOT_UNITS = frozenset({
    "+/-", "pos/neg", "units", "unit", "units/hr", "units/hour", "units/min", "million units", "dose", "date", "date and time",
    "mg pe", "oz", "ounce", "ounces", "str", "vl", "tab", "cap", "vial", "neb", "appl", "puff", "pkt", "drop",
    "drp", "gtt", "bag", "syr", "ptch", "inh", "amp", "loz", "spry", "troc", "udcup", "enema", "btl", "dbtl",
    "supp", "tube", "dev", "can", "aero", "kit"})


def _prefixed(atom: str, ucum: str, prefixes: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {p + atom: (p + ucum,) for p in prefixes}


# The atoms of clinical units, folded -> their UCUM readings. One reading: the atom means it in
# any case (no lab reports megagrams, megalitres or petagrams, so "MG" is mg). Two readings: the
# folded atom is used clinically both ways and only its written case can tell them apart.
ATOMS: dict[str, tuple[str, ...]] = {
    **_prefixed("g", "g", ("", "k", "m", "u", "n", "p", "f")),
    **_prefixed("mol", "mol", ("", "m", "u", "n", "p", "f")),
    **_prefixed("eq", "eq", ("", "m", "u")),
    **_prefixed("osm", "osm", ("", "m")),
    **_prefixed("l", "L", ("", "d", "c", "m", "u", "n", "p", "f")),
    **_prefixed("kat", "kat", ("", "m", "u", "n")),
    **_prefixed("m", "m", ("", "k", "c", "m", "u", "n")),
    **_prefixed("pa", "Pa", ("", "k")),
    **_prefixed("cal", "cal", ("", "k")),
    "s": ("s",), "ms": ("ms",), "sec": ("s",), "min": ("min",), "h": ("h",), "hr": ("h",), "d": ("d",),
    "day": ("d",), "wk": ("wk",), "mo": ("mo",), "mcg": ("ug",), "gm": ("g",),
    "u": ("U",), "ku": ("kU",), "uu": ("uU",), "mu": ("mU", "MU"),
    "iu": ("[IU]",), "[iu]": ("[IU]",), "kiu": ("k[IU]",), "k[iu]": ("k[IU]",), "uiu": ("u[IU]",),
    "u[iu]": ("u[IU]",), "miu": ("m[IU]", "M[IU]"), "m[iu]": ("m[IU]", "M[IU]"),
    "mm[hg]": ("mm[Hg]",), "cm[h2o]": ("cm[H2O]",), "[hpf]": ("[HPF]",), "[lpf]": ("[LPF]",), "hpf": ("[HPF]",),
    "lpf": ("[LPF]",), "[eu]": ("[EU]",), "[degf]": ("[degF]",), "cel": ("Cel",), "[in_i]": ("[in_i]",),
    "[lb_av]": ("[lb_av]",),
    # Words for atoms, as MIMIC-III combines them ('mL/hour', 'grams/min', 'cc/hr', 'dynes*sec/cm5'):
    # read alone, 'cc' is the centicoulomb.
    "cc": ("mL",), "hour": ("h",), "hours": ("h",), "hrs": ("h",), "minute": ("min",), "minutes": ("min",),
    "mins": ("min",), "second": ("s",), "seconds": ("s",), "secs": ("s",), "msec": ("ms",), "days": ("d",),
    "gram": ("g",), "grams": ("g",), "gms": ("g",), "liter": ("L",), "liters": ("L",), "litre": ("L",),
    "litres": ("L",), "inch": ("[in_i]",), "inches": ("[in_i]",), "lb": ("[lb_av]",), "lbs": ("[lb_av]",),
    "dyne": ("dyn",), "dynes": ("dyn",),
}
# UCUM codes common enough in lab exports to be known without loading the grammar.
KNOWN_UCUM = frozenset(SPELLINGS.values()) | frozenset({
    "mg/dL", "g/dL", "ug/dL", "ng/dL", "mg/L", "g/L", "ug/L", "ng/L", "ng/mL", "pg/mL", "ug/mL", "mg/mL",
    "U/mL", "mU/L", "mU/mL", "kU/L", "m[IU]/mL", "m[IU]/L", "mg/g", "fL", "pg", "%", "mmol/mol", "mosm/kg", "kPa",
    "/min", "L/L", "1"})
# What exports write for "no unit", folded. Filler marks alone ("-", "?", "...") are placeholders too.
PLACEHOLDERS = frozenset({
    "n/a", "n.a.", "n.a", "na", "null", "(null)", "<null>", "none", "(none)", "<none>", "nil", "nan", "unknown",
    "unk", "not applicable", "not available", "not recorded", "no unit", "no units", "missing", "undefined",
    "blank", "empty"})
_FILLER = re.compile(r"[-_.?*/\\~'\"`\s]+")
_MICRO = str.maketrans({"\u00b5": "u", "\u03bc": "u"})
ANNOTATION = re.compile(r"^\{[^{}]*\}$")
_ANNOTATIONS = re.compile(r"\{[^{}]*\}")
# An annotation, an atom with a bracketed part (and its prefix: "m[IU]", "mm[Hg]"), or a run of letters.
_TOKEN = re.compile(r"\{[^{}]*\}|[A-Za-z]*\[[^\[\]{}]*\]|[A-Za-z]+")
_AROUND_OPERATORS = re.compile(r"\s*([/.])\s*")
# UCUM's spelling of the words clinical units are written with, inside a longer unit (whole
# strings are SPELLINGS): the pressure columns (a trailing 'H20' is a zero typed for the O), the
# product ('*' between atoms; '10*3' keeps its power), an abbreviation's dot before '/'.
_WORDS = ((re.compile(r"(?<![A-Za-z\[])cm ?h2[o0](?![A-Za-z\]])", re.IGNORECASE), "cm[H2O]"),
          (re.compile(r"(?<![A-Za-z\[])mm ?hg(?![A-Za-z\]])", re.IGNORECASE), "mm[Hg]"),
          (re.compile(r"(?<=[A-Za-z])\*(?=[A-Za-z])"), "."), (re.compile(r"(?<=[A-Za-z])\.(?=/)"), ""))
MAX_READINGS = 8  # an ambiguous string lists at most this many readings (each ambiguous atom doubles them)
# Case variants are tried for atoms of at most this many letters (2**6 parses): a prefixed UCUM atom
# outside brackets is never longer ("dacal"), and free text ("milligrams") must not cost 2**10 parses.
MAX_CASE_LETTERS = 6
Meaning = Callable[[str], "Hashable | None"]  # a UCUM code -> what it means (None: it does not parse)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What one unit string is: its kind, the text as cleaned, and its UCUM code(s)."""

    kind: str  # BLANK, PLACEHOLDER, UCUM, AMBIGUOUS or TEXT
    text: str | None  # as written, trimmed, inner whitespace collapsed, micro signs read as 'u'
    ucum: str | None = None  # the UCUM code (kind UCUM only)
    readings: tuple[str, ...] = ()  # the UCUM codes it could be (kind AMBIGUOUS only), sorted


def clean(text: object) -> str | None:
    """A unit as written, trimmed, inner whitespace collapsed, micro signs read as 'u'; None when blank."""
    if text is None:
        return None
    if isinstance(text, float) and math.isnan(text):
        return None
    cleaned = " ".join(str(text).translate(_MICRO).split())
    return cleaned or None


def folded(text: str) -> str:
    """A cleaned unit string as written, case-folded, without spaces around '/' and '.': 'Deg. F' -> 'deg.f'."""
    return _AROUND_OPERATORS.sub(r"\1", text).casefold()


def _has_both_cases(text: str) -> bool:
    letters = [c for c in text if c.isascii() and c.isalpha()]
    return any(c.islower() for c in letters) and any(c.isupper() for c in letters)


def _letters(text: str) -> str:
    return "".join(c for c in text if c.isascii() and c.isalpha())


def _case_variants(token: str) -> list[str]:
    """Every spelling of `token` with its letters in either case (none for tokens too long to try)."""
    at = [i for i, c in enumerate(token) if c.isascii() and c.isalpha()]
    if len(at) > MAX_CASE_LETTERS:
        return []
    out = set()
    for cases in itertools.product((str.lower, str.upper), repeat=len(at)):
        chars = list(token)
        for i, case in zip(at, cases):
            chars[i] = case(chars[i])
        out.add("".join(chars))
    return sorted(out)


def _by_case(token: str, meaning: Meaning) -> str | tuple[str, ...] | None:
    """A one-case token outside the lexicon: its one reading, its readings when several, None when none."""
    readings: dict[Hashable, str] = {}
    for variant in _case_variants(token):
        m = meaning(variant)
        if m is not None:
            readings.setdefault(m, variant)
    if len(readings) > 1:
        return tuple(sorted(readings.values()))
    return next(iter(readings.values()), None)


def _atom(token: str, cased: bool, meaning: Meaning) -> str | tuple[str, ...] | None:
    """One token's UCUM spelling, its readings when ambiguous, or None when it is no atom this reads."""
    if token.startswith("{"):
        return token  # an annotation: case does not matter
    options = ATOMS.get(token.casefold())
    if options is None:
        return token if cased else _by_case(token, meaning)
    if len(options) == 1:
        return options[0]
    written = [o for o in options if _letters(o) == _letters(token)] if _has_both_cases(token) else []
    return written[0] if len(written) == 1 else options


def read(text: object, meaning: Meaning) -> Reading:
    """What the unit string `text` is (module docstring); `meaning(code)` is what UCUM's grammar makes of a code."""
    cleaned = clean(text)
    if cleaned is None:
        return Reading(BLANK, None)
    folded = cleaned.casefold()
    if folded in PLACEHOLDERS or _FILLER.fullmatch(cleaned):
        return Reading(PLACEHOLDER, cleaned)
    if cleaned in KNOWN_UCUM:
        return Reading(UCUM, cleaned, cleaned)
    if folded in SPELLINGS:
        return Reading(UCUM, cleaned, SPELLINGS[folded])
    if folded in NOT_UNITS:
        return Reading(TEXT, cleaned)
    if ANNOTATION.match(cleaned):
        return Reading(UCUM, cleaned, cleaned)  # '{ratio}', '{score}': valid UCUM, dimensionless, arbitrary
    compact = _AROUND_OPERATORS.sub(r"\1", cleaned)  # 'mg / dL' is 'mg/dL'
    for pattern, ucum in _WORDS:
        compact = pattern.sub(ucum, compact)
    cased = _has_both_cases(_ANNOTATIONS.sub("", compact))
    pieces: list[str | tuple[str, ...]] = []
    last = 0
    for match in _TOKEN.finditer(compact):
        atom = _atom(match.group(), cased, meaning)
        if atom is None:
            return Reading(TEXT, cleaned)
        pieces += [compact[last:match.start()], atom]
        last = match.end()
    pieces.append(compact[last:])
    choices = [p if isinstance(p, tuple) else (p,) for p in pieces]
    candidates = ["".join(c) for c in itertools.islice(itertools.product(*choices), 2 ** 10)]
    found = sorted({c for c in candidates if c in KNOWN_UCUM or meaning(c) is not None})
    if len(found) > 1:
        return Reading(AMBIGUOUS, cleaned, None, tuple(found[:MAX_READINGS]))
    if found:
        return Reading(UCUM, cleaned, found[0])
    return Reading(TEXT, cleaned)
