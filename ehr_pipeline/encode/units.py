"""Units of measure: one reader of unit strings and one converter, for the job, the service and FHIR.

A value means something to the model only in the unit its training data used. Hospitals
differ: most of the world reports creatinine in umol/L where MIMIC-III writes mg/dL, and a
model fed 88 as if it were mg/dL is confidently wrong for almost every patient. So every
numeric value is moved to its code's **canonical unit** before it is bagged:

* A unit string as written ("mg/dL", "MEQ/L", "K/uL", "?F", "umol/L", "N/A", "MU/L") is read
  by ``unit_strings.read``: blank, a placeholder, a UCUM code (known spellings, a lexicon of
  clinical atoms for strings in one case, the UCUM grammar ``ucumvert`` for the rest),
  ambiguous under case folding, or text. Nothing is guessed from a string that does not parse
  or that reads two ways. A unit written alike up to case is the same unit as itself whatever a
  reader makes of either spelling (``Converter.same``): a text canonical unit is stored folded,
  and the fold may parse ('deg. f' as degree times farad) where the string as written did not.
* Each code's canonical unit is the unit most of its training rows were recorded in
  (``canonical_units``), or a reference's (a model's export) when data from another site is
  prepared for that model.
* ``Converter.conversion`` finds the affine map (scale, offset) between two units of the same
  quantity, with pint; between mass and substance concentrations (mg/dL <-> umol/L) it uses
  the analyte's molar mass (``ANALYTES``, keyed by LOINC), and between equivalents and moles
  its valence.
* ``Harmoniser`` applies it to arrays of events; each value gets one outcome (``OUTCOMES``). A
  value is NOT used (NaN: the event still counts as an occurrence) when its unit cannot be
  converted, is ambiguous, is a placeholder on a code that has a unit, or when the conversion
  lands the values implausibly far from the code's training median (``magnitudes``); the job
  dead-letters it, the service warns. A value without a unit is taken to be in the canonical
  unit (``NO_UNIT``): MIMIC-III leaves VALUEUOM empty on ~10% of lab rows of codes that are
  otherwise always in one unit.

Cheap to import: pint and the UCUM grammar load on the first unit that is not spelled like its
canonical unit, which on a release in one set of units is never.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ehr_pipeline.encode import magnitudes, unit_strings

logger = logging.getLogger(__name__)

# What happened to one numeric value (every value gets exactly one).
SAME = "same_unit"  # recorded in the canonical unit (any spelling of it)
CONVERTED = "converted"  # recorded in another unit of the same quantity, converted
NO_UNIT = "no_unit"  # recorded without a unit: taken to be in the canonical unit
UNCHECKED = "unchecked"  # the code has no canonical unit (training never saw one): used as recorded
NOT_CONVERTIBLE = "not_convertible"  # a unit that cannot be converted to the canonical one: value not used
AMBIGUOUS = "ambiguous_unit"  # a unit that reads as two units under case folding ('MU/L'): value not used
PLACEHOLDER = "placeholder_unit"  # 'N/A', 'NULL', '-' on a code that has a unit: value not used
IMPLAUSIBLE = "implausible_conversion"  # converted, it would land beyond magnitudes.BOUND: value not used
OUTCOMES = (SAME, CONVERTED, NO_UNIT, UNCHECKED, NOT_CONVERTIBLE, AMBIGUOUS, PLACEHOLDER, IMPLAUSIBLE)
# The outcomes whose values are not used, and the reason each is counted under: the job's dead
# letters (dead_letter/values_not_convertible.jsonl) and the service's warning kinds alike.
NOT_USED: dict[str, str] = {NOT_CONVERTIBLE: "unit_not_convertible", AMBIGUOUS: "unit_ambiguous",
                            PLACEHOLDER: "unit_placeholder", IMPLAUSIBLE: "conversion_implausible"}

_LITRE = re.compile(r"(?<![A-Za-z\[])([munpfdc]?)l(?![A-Za-z\]])")
# Dimensionless pint units that are plain numbers: any other dimensionless atom ([IU], [HPF],
# [EU], annotations) is an arbitrary unit that converts to nothing but itself.
_PURE_NUMBERS = frozenset({"_10", "percent", "permille", "ppm", "ppb", "ppth", "pptr", "dimensionless"})


@dataclasses.dataclass(frozen=True)
class Analyte:
    """A chemistry analyte: its LOINC codes (mass and substance variants), molar mass (g/mol) and charge."""

    name: str
    molar_mass: float | None  # g/mol; None where no molar conversion applies
    loinc: tuple[str, ...]
    valence: int = 1  # charge per particle: mEq = valence x mmol
    note: str = ""
    # (arbitrary UCUM atom, the unit it equals for this analyte): the Ehrlich unit of urobilinogen
    # is defined as 1 mg of it, so MIMIC's urinalysis writes EU/dL and mg/dL for one item.
    equivalents: tuple[tuple[str, str], ...] = ()


# Molar masses: standard atomic weights (IUPAC CIAAW 2021) and PubChem's computed molecular weights;
# LOINC codes from the LOINC table (serum/plasma/blood, mass and substance concentration variants).
# The mass form of a few analytes is not the molecule: urea nitrogen is reported as the mass of the
# urea's two nitrogen atoms (so 1 mg/dL = 0.357 mmol/L of urea), phosphate as phosphorus, and
# haemoglobin in mmol/L (the Netherlands) counts the monomer (Hb/4).
ANALYTES: tuple[Analyte, ...] = (
    Analyte("creatinine", 113.12, ("2160-0", "38483-4", "14682-9", "59826-8"), note="PubChem CID 588"),
    Analyte("glucose", 180.16, ("2345-7", "2339-0", "41653-7", "14749-6", "15074-8", "14743-9"),
            note="PubChem CID 5793"),
    Analyte("urea nitrogen", 28.014, ("3094-0", "6299-2", "22664-7", "14937-7"), note="2 x N, IUPAC"),
    Analyte("calcium", 40.078, ("17861-6", "2000-8", "49765-1"), valence=2, note="IUPAC"),
    Analyte("ionized calcium", 40.078, ("1994-3", "1995-0", "17863-2"), valence=2, note="IUPAC"),
    Analyte("magnesium", 24.305, ("19123-9", "2601-3"), valence=2, note="IUPAC"),
    Analyte("phosphate", 30.974, ("2777-1", "14879-1"), note="as phosphorus, IUPAC"),
    Analyte("bilirubin total", 584.66, ("1975-2", "42719-5", "14631-6"), note="PubChem CID 5280352"),
    Analyte("bilirubin direct", 584.66, ("1968-7", "14629-0"), note="PubChem CID 5280352"),
    Analyte("lactate", 90.08, ("2524-7", "32693-4", "14118-4", "2518-9"), note="lactic acid, PubChem CID 612"),
    Analyte("urate", 168.11, ("3084-1", "14933-6"), note="uric acid, PubChem CID 1175"),
    Analyte("cholesterol", 386.65, ("2093-3", "14647-2"), note="PubChem CID 5997"),
    Analyte("triglyceride", 885.43, ("2571-8", "14927-8"), note="as triolein, PubChem CID 5497163"),
    Analyte("iron", 55.845, ("2498-4", "14798-3"), note="IUPAC"),
    Analyte("ammonia", 17.031, ("16362-6", "1841-6"), note="IUPAC"),
    Analyte("sodium", 22.990, ("2951-2", "2947-0"), note="IUPAC"),
    Analyte("potassium", 39.098, ("2823-3", "6298-4"), note="IUPAC"),
    Analyte("chloride", 35.45, ("2075-0", "2069-3"), note="IUPAC"),
    Analyte("bicarbonate", 61.017, ("1963-8", "1959-6", "2028-9"), note="HCO3-, IUPAC"),
    Analyte("haemoglobin", 16114.5, ("718-7", "20509-6", "59260-0"), note="monomer Hb/4"),
    Analyte("albumin", 66472.0, ("1751-7", "61151-7"), note="UniProt P02768 mature chain"),
    Analyte("urobilinogen", None, ("5818-0", "20405-7"), equivalents=(("[EU]", "mg"),),
            note="1 Ehrlich unit = 1 mg urobilinogen (test-strip convention); 5818-0 is MIMIC-III's code"),
)
ANALYTE_BY_LOINC: dict[str, Analyte] = {code: a for a in ANALYTES for code in a.loinc}


@dataclasses.dataclass(frozen=True)
class Conversion:
    """value_in_canonical = value * scale + offset (offset is non-zero only for temperatures)."""

    scale: float
    offset: float = 0.0

    @property
    def identity(self) -> bool:
        """True when the conversion leaves every value unchanged (to 1e-12)."""
        return math.isclose(self.scale, 1.0, rel_tol=1e-12) and abs(self.offset) < 1e-12

    def apply(self, values: np.ndarray | float) -> np.ndarray | float:
        """The values in the canonical unit."""
        return values * self.scale + self.offset


IDENTITY = Conversion(1.0)


_REGISTRY_LOCK = threading.Lock()
_REGISTRY: list[Any] = []  # the process's one unit registry, once built


def _process_registry() -> Any:
    """The process's UCUM unit registry, built on first use (about a second) and shared by every Converter."""
    # Building it costs ~0.7 s of CPU: a job stage, a test or a request path that makes a Converter of its
    # own would otherwise pay that each time. The registry is read-only once built.
    with _REGISTRY_LOCK:  # the service converts on several threads: build it once
        if not _REGISTRY:
            # Imported here: pint and the grammar cost a second, paid only when a unit needs them.
            from ucumvert import PintUcumRegistry

            _REGISTRY.append(PintUcumRegistry())
    return _REGISTRY[0]


class Converter:
    """Reads unit strings as UCUM and finds conversions; loads pint on the first unit that needs it.

    Instance state is a cache (one entry per distinct string or pair), so one Converter per
    process or worker serves every call.
    """

    def __init__(self) -> None:
        self._registry: Any = None
        self._readings: dict[str, unit_strings.Reading] = {}
        self._pint: dict[str, Any] = {}
        self._meanings: dict[str, Any] = {}
        self._conversions: dict[tuple[str, str, str | None], tuple[Conversion | None, str]] = {}

    # --- reading unit strings

    def load(self) -> None:
        """Builds the unit registry now (about a second) rather than at the first value that needs it."""
        self._registry_()

    def _registry_(self) -> Any:
        if self._registry is None:
            self._registry = _process_registry()
        return self._registry

    def _parse(self, ucum: str) -> Any:
        """The pint Unit of a UCUM code, or None when it does not parse (annotation-only units included)."""
        if ucum in self._pint:
            return self._pint[ucum]
        unit = None
        if not unit_strings.ANNOTATION.match(ucum):
            try:
                parsed = self._registry_().from_ucum(ucum)
                unit = getattr(parsed, "units", None)
                if unit is not None and getattr(parsed, "magnitude", 1) != 1:
                    unit = parsed  # "mg/(24.h)" parses to a Quantity of magnitude 1/24: keep the factor
            except Exception:  # noqa: BLE001  (the grammar raises lark, pint and attribute errors alike)
                unit = None
        self._pint[ucum] = unit
        return unit

    def _meaning(self, ucum: str) -> tuple | None:
        """What a UCUM code means (dimension, size in base units, arbitrary atoms); None when it does not parse.

        Two case variants of an atom are one reading only when they mean the same ('l', 'L').
        """
        if ucum not in self._meanings:
            parsed = self._parse(ucum)
            meaning = None
            if parsed is not None:
                try:
                    base = self._registry_().Quantity(self._factor_of(parsed), self._units_of(parsed)).to_base_units()
                    meaning = (str(base.dimensionality), float(f"{base.magnitude:.9g}"), self._arbitrary(parsed))
                except Exception:  # noqa: BLE001  (pint refuses some offset and log units in base units)
                    meaning = None
            self._meanings[ucum] = meaning
        return self._meanings[ucum]

    def reading(self, text: object) -> unit_strings.Reading:
        """What a unit as written is: blank, placeholder, UCUM (with its code), ambiguous or text (unit_strings)."""
        cleaned = unit_strings.clean(text)
        if cleaned is None:
            return unit_strings.Reading(unit_strings.BLANK, None)
        if cleaned not in self._readings:
            self._readings[cleaned] = unit_strings.read(cleaned, self._meaning)
        return self._readings[cleaned]

    def ucum(self, text: object) -> str | None:
        """The UCUM code of a unit as written ('MG/DL' -> 'mg/dL', 'K/uL' -> '10*3/uL'), None if it is not one."""
        return self.reading(text).ucum

    def key(self, text: object) -> str | None:
        """What identifies a unit: its UCUM code, else its text case-folded; None when blank or a placeholder."""
        reading = self.reading(text)
        if reading.kind in (unit_strings.BLANK, unit_strings.PLACEHOLDER):
            return None
        # UCUM has two symbols for the litre, 'l' and 'L': one key, so 'ng/ml' and 'ng/mL' count as one unit.
        return _LITRE.sub(r"\1L", reading.ucum) if reading.ucum else reading.text.casefold()

    def same(self, unit: object, other: object) -> bool:
        """Whether two unit strings are one unit: one key, or one spelling up to case that case does not tell apart.

        A canonical unit that is text is stored by its key, case-folded, and folded text can read
        otherwise than as written: a unit no reader knew, written 'Deg. F', was stored 'deg. f',
        which the grammar reads as the degree (angle) times the farad, so the unit never matched
        itself. Written alike up to case, two strings are one unit unless a reading shows that
        case decides what they are (both read as different UCUM units, or one is ambiguous).
        """
        a, b = self.key(unit), self.key(other)
        if a is None or b is None:
            return False
        if a == b:
            return True  # a string no unit reader knows ('units', 'MU/L') still matches itself
        ra, rb = self.reading(unit), self.reading(other)
        if unit_strings.folded(ra.text) != unit_strings.folded(rb.text):
            return False
        return unit_strings.AMBIGUOUS not in (ra.kind, rb.kind) and not ra.kind == rb.kind == unit_strings.UCUM

    # --- conversions

    def conversion(self, unit: object, canonical: object, loinc: str | None = None) -> tuple[Conversion | None, str]:
        """(the map from `unit` to `canonical`, why not when None); `loinc` names the analyte for molar conversions."""
        src, dst = self.key(unit), self.key(canonical)
        if src is None or dst is None:
            return None, "no unit"
        if self.same(unit, canonical):
            return IDENTITY, ""
        for reading in (self.reading(unit), self.reading(canonical)):
            if reading.kind == unit_strings.AMBIGUOUS:
                return None, (f"{reading.text!r} reads as {' or '.join(map(repr, reading.readings))} depending on "
                              "its letter case, which this spelling does not show")
            if reading.kind != unit_strings.UCUM:
                return None, f"{reading.text!r} is not a unit this converter reads (UCUM or a known spelling)"
        pair = (src, dst, loinc)
        if pair not in self._conversions:
            self._conversions[pair] = self._convert(src, dst, loinc)
        return self._conversions[pair]

    def _convert(self, src: str, dst: str, loinc: str | None) -> tuple[Conversion | None, str]:
        analyte = ANALYTE_BY_LOINC.get(loinc or "")
        for atom, equal in analyte.equivalents if analyte is not None else ():
            if atom in src or atom in dst:  # an arbitrary unit this analyte defines: read it as its equal
                return self._convert(src.replace(atom, equal), dst.replace(atom, equal), None)
        a, b = self._parse(src), self._parse(dst)
        if a is None or b is None:
            which = src if a is None else dst
            return None, f"{which!r} is not a unit this converter reads (UCUM or a known spelling)"
        if self._arbitrary(a) != self._arbitrary(b):
            if ("[IU]" in src) != ("[IU]" in dst):
                # An enzyme's international unit is the enzyme unit U (IUB 1961): '[IU]/L' for ALT
                # is 'U/L'. Only tried when the other side has no [IU] of its own.
                return self._convert(src.replace("[IU]", "U"), dst.replace("[IU]", "U"), loinc)
            return None, "arbitrary units (IU, per field, annotations) convert only to themselves"
        reg = self._registry_()
        ua, ub = self._units_of(a), self._units_of(b)
        fa, fb = self._factor_of(a), self._factor_of(b)
        if ua.dimensionality == ub.dimensionality:
            affine = self._affine(reg, ua, ub, fa, fb)
            if analyte is None:
                return affine, ""
            return Conversion(affine.scale * self._valence_factor(ua, ub, analyte), affine.offset), ""
        ratio = ua.dimensionality / ub.dimensionality
        mass_per_mol = reg.Quantity(1, "gram / mole").dimensionality
        if analyte is None or analyte.molar_mass is None:
            if ratio in (mass_per_mol, 1 / mass_per_mol):
                return None, "mass <-> substance needs the analyte's molar mass: no LOINC with one known for this code"
            return None, f"{src!r} and {dst!r} measure different quantities"
        molar = reg.Quantity(analyte.molar_mass, "gram / mole")
        if ratio == mass_per_mol:  # mass -> substance: divide by the molar mass
            scale = (reg.Quantity(fa, ua) / molar).to(ub).magnitude / fb
        elif ratio == 1 / mass_per_mol:  # substance -> mass
            scale = (reg.Quantity(fa, ua) * molar).to(ub).magnitude / fb
        else:
            return None, f"{src!r} and {dst!r} measure different quantities"
        return Conversion(scale * self._valence_factor(ua, ub, analyte)), ""

    def _affine(self, reg: Any, ua: Any, ub: Any, fa: float, fb: float) -> Conversion:
        # Two points give scale and offset (degF <-> Cel is affine, everything else linear).
        zero = reg.Quantity(0.0, ua).to(ub).magnitude
        one = reg.Quantity(1.0, ua).to(ub).magnitude
        return Conversion((one - zero) * fa / fb, zero / fb)

    @staticmethod
    def _units_of(parsed: Any) -> Any:
        return getattr(parsed, "units", parsed)

    @staticmethod
    def _factor_of(parsed: Any) -> float:
        return float(getattr(parsed, "magnitude", 1.0))

    def _arbitrary(self, parsed: Any) -> tuple[tuple[str, int], ...]:
        """The dimensionless atoms of a unit that are not plain numbers, with exponents ([IU], [HPF], ...)."""
        reg = self._registry_()
        out = []
        for name, power in self._units_of(parsed)._units.items():
            _, base, _ = reg.parse_unit_name(name)[0] if reg.parse_unit_name(name) else ("", name, "")
            if base in _PURE_NUMBERS:
                continue
            if reg.Quantity(1, base).dimensionless:
                out.append((base, int(power)))
        return tuple(sorted(out))

    def _valence_factor(self, ua: Any, ub: Any, analyte: Analyte) -> float:
        """UCUM counts an equivalent as a mole: for a divalent ion 1 meq is 0.5 mmol, so rescale by the charge."""
        def eq_power(u: Any) -> int:
            return sum(int(p) for n, p in u._units.items() if n.endswith("equivalents"))
        return float(analyte.valence) ** (eq_power(ub) - eq_power(ua))


def canonical_units(counts: Mapping[str, Mapping[str, int]], converter: Converter,
                    reference: Mapping[str, str] | None = None) -> dict[str, str]:
    """code -> canonical unit: the reference's where it has one, else the unit most rows used (UCUM where known).

    ``counts`` is ``{code: {unit as written: rows with a value}}``. Spellings of one unit
    ("mg/dL", "MG/DL") count together; ties go to the alphabetically first key.
    """
    out: dict[str, str] = {}
    for code in sorted(counts):
        if reference is not None and reference.get(code):
            out[code] = reference[code]
            continue
        by_key: dict[str, int] = {}
        for unit, n in counts[code].items():
            k = converter.key(unit)
            if k is not None:
                by_key[k] = by_key.get(k, 0) + int(n)
        if by_key:
            out[code] = min(by_key, key=lambda k: (-by_key[k], k))
    if reference is not None:
        for code, unit in reference.items():
            out.setdefault(code, unit)
    return dict(sorted(out.items()))


class UnusedValue(NamedTuple):
    """One value not used: which event, its outcome (a key of NOT_USED), its unit, the code's canonical unit, why."""

    index: int
    outcome: str
    unit: str
    canonical: str
    why: str


@dataclasses.dataclass(frozen=True)
class Harmonised:
    """Values in their codes' canonical units, and what happened to each."""

    values: np.ndarray  # float64, NaN where there was no value or it is not used
    outcomes: np.ndarray  # object [n]: one of OUTCOMES per event with a value, "" where there is no value
    problems: tuple[UnusedValue, ...]  # one per value not used, by event index

    def counts(self, codes: np.ndarray | None = None) -> dict[str, int]:
        """Events per outcome (every outcome listed); with codes, keyed 'source/outcome'."""
        if codes is None:
            return {o: int(np.count_nonzero(self.outcomes == o)) for o in OUTCOMES}
        out: dict[str, int] = {}
        for code, outcome in zip(codes, self.outcomes):
            if outcome:
                key = f"{str(code).split(':', 1)[0]}/{outcome}"
                out[key] = out.get(key, 0) + 1
        return out


class Harmoniser:
    """Moves events' values to their codes' canonical units: the one conversion of the job and the service.

    ``medians`` ('source:code' -> training median |value| in the canonical unit) turns on the
    plausibility bound (``magnitudes``); ``unit_medians`` (code -> unit key -> typical |value|
    in that unit) are the job's, from its census of the whole release; without them a pair's
    values in the call are its sample (the service: one request).
    """

    def __init__(self, canonical: Mapping[str, str], loinc: Mapping[str, str] | None = None,
                 converter: Converter | None = None, seen: Mapping[str, Iterable[str]] | None = None,
                 medians: Mapping[str, float] | None = None,
                 unit_medians: Mapping[str, Mapping[str, float]] | None = None):
        self.canonical = dict(canonical)
        self.loinc = dict(loinc or {})
        self.converter = converter or Converter()
        self.medians = dict(medians or {})
        self._unit_medians = {code: dict(by_unit) for code, by_unit in (unit_medians or {}).items()}
        self._seen = {code: list(written) for code, written in (seen or {}).items()}  # the training census

    def seen_in_training(self, code: str, unit: object) -> bool:
        """Whether the training data had values of `code` in `unit` (any spelling): unusable there as here."""
        seen = self._seen.get(code, ())
        if self.converter.reading(unit).kind == unit_strings.PLACEHOLDER:
            return any(self.converter.reading(u).kind == unit_strings.PLACEHOLDER for u in seen)
        key = self.converter.key(unit)
        return key is not None and any(self.converter.key(u) == key for u in seen)

    def resolve(self, code: str, unit: object) -> tuple[str, Conversion | None, str]:
        """(outcome, conversion or None, why not) for one code's value recorded in `unit`, before plausibility."""
        reading = self.converter.reading(unit)
        if reading.kind == unit_strings.BLANK:
            return NO_UNIT, IDENTITY, ""
        canonical = self.canonical.get(code)
        if canonical is None:
            return UNCHECKED, IDENTITY, ""
        if reading.kind == unit_strings.PLACEHOLDER:
            return PLACEHOLDER, None, f"{reading.text!r} is a placeholder, not a unit; the code's values are in " \
                                      f"{canonical!r}"
        conversion, why = self.converter.conversion(unit, canonical, self.loinc.get(code))
        if conversion is None:
            ambiguous = unit_strings.AMBIGUOUS in (reading.kind, self.converter.reading(canonical).kind)
            return (AMBIGUOUS if ambiguous else NOT_CONVERTIBLE), None, why
        return (SAME if conversion.identity else CONVERTED), conversion, ""

    def implausible(self, code: str, unit: object, conversion: Conversion, values: np.ndarray) -> str:
        """Why converting `values` of `code` from `unit` breaks the plausibility bound; '' when it does not."""
        median = self.medians.get(code)
        if median is None:
            return ""
        typical = self._unit_medians.get(code, {}).get(self.converter.key(unit) or "")
        if typical is None:
            typical = magnitudes.typical(magnitudes.sketch(values))
        if typical is None:
            return ""
        ratio = magnitudes.moved_ratio(float(conversion.apply(typical)), median)
        if magnitudes.plausible(ratio):
            return ""
        return (f"once converted, its values (median about {typical:.3g}) would lie at {ratio:.3g} times the code's "
                f"training median ({median:.3g} {self.canonical[code]}), outside the plausible "
                f"{1 / magnitudes.BOUND:g} to {magnitudes.BOUND:g} times")

    def harmonise(self, codes: np.ndarray, units: Iterable[object], values: np.ndarray) -> Harmonised:
        """Values of events (codes 'source:code', units as written, NaN = no value) in canonical units."""
        values = np.array(values, dtype=np.float64, copy=True)
        codes = np.asarray(codes, dtype=object)
        units = np.asarray(list(units) if not isinstance(units, np.ndarray) else units, dtype=object)
        outcomes = np.full(values.shape, "", dtype=object)
        has = ~np.isnan(values)
        problems: list[UnusedValue] = []
        if not has.any():
            return Harmonised(values, outcomes, ())
        # One resolution per distinct (code, unit) pair: a block has thousands of events, tens of pairs.
        idx = np.flatnonzero(has)
        pairs: dict[tuple[str, object], list[int]] = {}
        for i in idx:
            pairs.setdefault((str(codes[i]), unit_strings.clean(units[i])), []).append(int(i))
        samples: dict[tuple[str, str | None], list[int]] = {}  # spellings of one unit are one sample, as in the job
        for (code, unit), members in pairs.items():
            samples.setdefault((code, self.converter.key(unit)), []).extend(members)
        for (code, unit), members in pairs.items():
            outcome, conversion, why = self.resolve(code, unit)
            at = np.asarray(members, dtype=np.int64)
            if outcome == CONVERTED:
                why = self.implausible(code, unit, conversion, values[samples[(code, self.converter.key(unit))]])
                if why:
                    outcome, conversion = IMPLAUSIBLE, None
            outcomes[at] = outcome
            if conversion is None:
                values[at] = np.nan
                canonical = self.canonical.get(code, "")
                problems.extend(UnusedValue(int(i), outcome, str(unit), canonical, why) for i in at)
            elif not conversion.identity:
                values[at] = conversion.apply(values[at])
        problems.sort()
        return Harmonised(values, outcomes, tuple(problems))


def read_units_file(doc: Mapping[str, Any]) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """(rows per code and unit as written, canonical unit per code) from a units.json document."""
    counts = {str(c): {str(u): int(n) for u, n in units.items()} for c, units in (doc.get("codes") or {}).items()}
    canonical = {str(c): str(u) for c, u in (doc.get("canonical") or {}).items()}
    return counts, canonical


class Reference(NamedTuple):
    """A model's units, as `ehr-pipeline run --units-from` reads them from its units.json."""

    canonical: dict[str, str]  # 'source:code' -> the unit its values were converted to
    medians: dict[str, float]  # 'source:code' -> training median |value| in it ({} before medians existed)


def read_medians(doc: Mapping[str, Any]) -> dict[str, float]:
    """Training median |value| per code in its canonical unit from a units.json document; {} before they existed."""
    return {str(c): float(m) for c, m in (doc.get("medians") or {}).items()}


def describe(unit: str | None) -> str:
    """A unit for messages: 'mg/dL', or 'no unit'."""
    return unit if unit else "no unit"
