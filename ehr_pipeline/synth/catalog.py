"""Built-in item catalogue of the synthetic MIMIC-III generator.

Item ids, labels, units and LOINC codes are MIMIC-III v1.4 facts (public documentation of
the release); value ranges are textbook adult reference ranges and plausible ICU
spreads, written for this project. Nothing here is read from the demo: the generator
must work without it. ``load_dictionaries`` can optionally enrich the written D_ITEMS /
D_LABITEMS with a real release's dictionaries.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import pathlib

import pyarrow as pa

from ehr_pipeline import reader
from ehr_pipeline.reader import table_schemas

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LabItem:
    """One LABEVENTS item and how its values are drawn.

    A value is ``centre + shift * s + sd * z`` (in log space when ``log`` is set), where
    ``s`` is the admission's latent severity (standard normal) and ``z`` noise, then
    clipped to ``[lo, hi]`` and rounded to ``decimals``.
    """

    itemid: int
    label: str
    category: str  # D_LABITEMS.CATEGORY: "Chemistry", "Hematology", "Blood Gas"
    loinc: str
    unit: str | None  # LABEVENTS.VALUEUOM (INR has none in MIMIC)
    panel: str  # which draw orders it: chem, cbc, gas, coag, lft
    centre: float
    sd: float
    shift: float  # change of the centre per SD of severity
    lo: float
    hi: float
    ref_lo: float  # outside [ref_lo, ref_hi] -> FLAG "abnormal"
    ref_hi: float
    decimals: int
    log: bool = False


def _lab(itemid, label, category, loinc, unit, panel, centre, sd, shift, lo, hi, ref_lo, ref_hi,
         decimals, log=False) -> LabItem:
    return LabItem(itemid, label, category, loinc, unit, panel, centre, sd, shift, lo, hi, ref_lo,
                   ref_hi, decimals, log)


# Centres of log items are given as natural values and converted below, so the table
# reads in clinical units.
LAB_ITEMS: tuple[LabItem, ...] = tuple(
    dataclasses.replace(i, centre=math.log(i.centre)) if i.log else i
    for i in (
        # --- chemistry (the "chem 7" plus extras, drawn together) ---
        _lab(50983, "Sodium", "Chemistry", "2951-2", "mEq/L", "chem", 139, 3.5, -1.0, 110, 170, 133, 145, 0),
        _lab(50971, "Potassium", "Chemistry", "2823-3", "mEq/L", "chem", 4.1, 0.5, 0.2, 2.0, 8.0, 3.3, 5.1, 1),
        _lab(50902, "Chloride", "Chemistry", "2075-0", "mEq/L", "chem", 103, 4.0, 0.0, 75, 130, 96, 108, 0),
        _lab(50882, "Bicarbonate", "Chemistry", "1963-8", "mEq/L", "chem", 25, 3.5, -2.5, 5, 45, 22, 32, 0),
        _lab(51006, "Urea Nitrogen", "Chemistry", "3094-0", "mg/dL", "chem", 18, 0.45, 0.3, 2, 200, 6, 20, 0, True),
        _lab(50912, "Creatinine", "Chemistry", "2160-0", "mg/dL", "chem", 1.0, 0.35, 0.35, 0.2, 15, 0.5, 1.1, 1, True),
        _lab(50931, "Glucose", "Chemistry", "2345-7", "mg/dL", "chem", 125, 0.3, 0.1, 30, 800, 70, 105, 0, True),
        _lab(50868, "Anion Gap", "Chemistry", "1863-0", "mEq/L", "chem", 14, 3.0, 2.0, 3, 40, 8, 20, 0),
        _lab(50960, "Magnesium", "Chemistry", "2601-3", "mg/dL", "chem", 2.0, 0.3, 0.0, 0.8, 5.0, 1.6, 2.6, 1),
        _lab(50893, "Calcium, Total", "Chemistry", "2000-8", "mg/dL", "chem", 8.7, 0.6, -0.3, 5, 14, 8.4, 10.3, 1),
        _lab(50970, "Phosphate", "Chemistry", "2777-1", "mg/dL", "chem", 3.5, 0.9, 0.4, 0.5, 12, 2.7, 4.5, 1),
        # --- complete blood count ---
        _lab(51301, "White Blood Cells", "Hematology", "804-5", "K/uL", "cbc", 9.5, 0.35, 0.25, 0.1, 80, 4.0, 11.0, 1, True),
        _lab(51222, "Hemoglobin", "Hematology", "718-7", "g/dL", "cbc", 11.0, 1.8, -0.6, 4, 19, 12, 16, 1),
        _lab(51221, "Hematocrit", "Hematology", "4544-3", "%", "cbc", 33, 5.0, -1.8, 12, 58, 36, 48, 1),
        _lab(51265, "Platelet Count", "Hematology", "777-3", "K/uL", "cbc", 220, 0.4, -0.2, 5, 1000, 150, 440, 0, True),
        _lab(51279, "Red Blood Cells", "Hematology", "789-8", "m/uL", "cbc", 3.7, 0.6, -0.2, 1.5, 6.5, 4.2, 5.4, 2),
        _lab(51250, "MCV", "Hematology", "787-2", "fL", "cbc", 90, 6.0, 0.0, 60, 120, 82, 98, 0),
        _lab(51277, "RDW", "Hematology", "788-0", "%", "cbc", 14.8, 1.8, 0.4, 11, 30, 10.5, 15.5, 1),
        # --- arterial blood gas: ordered more often for sicker patients ---
        _lab(50813, "Lactate", "Blood Gas", "32693-4", "mmol/L", "gas", 1.4, 0.35, 0.45, 0.3, 25, 0.5, 2.0, 1, True),
        _lab(50820, "pH", "Blood Gas", "11558-4", "units", "gas", 7.39, 0.05, -0.04, 6.8, 7.7, 7.35, 7.45, 2),
        _lab(50818, "pCO2", "Blood Gas", "11557-6", "mm Hg", "gas", 41, 7.0, 0.0, 15, 110, 35, 45, 0),
        _lab(50821, "pO2", "Blood Gas", "11556-8", "mm Hg", "gas", 110, 0.4, -0.1, 30, 600, 85, 105, 0, True),
        _lab(50802, "Base Excess", "Blood Gas", "11555-0", "mEq/L", "gas", 0, 3.5, -2.5, -30, 20, -2, 3, 0),
        # --- coagulation ---
        _lab(51237, "INR(PT)", "Hematology", "5895-7", None, "coag", 1.2, 0.2, 0.1, 0.8, 10, 0.9, 1.1, 1, True),
        _lab(51274, "PT", "Hematology", "5902-2", "sec", "coag", 13.5, 0.15, 0.08, 9, 100, 10.4, 13.4, 1, True),
        _lab(51275, "PTT", "Hematology", "3173-2", "sec", "coag", 31, 0.25, 0.1, 18, 150, 22, 35, 1, True),
        # --- liver panel ---
        _lab(50861, "Alanine Aminotransferase (ALT)", "Chemistry", "1742-6", "IU/L", "lft", 30, 0.8, 0.3, 3, 5000, 0, 40, 0, True),
        _lab(50878, "Asparate Aminotransferase (AST)", "Chemistry", "1920-8", "IU/L", "lft", 35, 0.8, 0.35, 5, 8000, 0, 40, 0, True),
        _lab(50863, "Alkaline Phosphatase", "Chemistry", "6768-6", "IU/L", "lft", 85, 0.5, 0.1, 15, 1500, 39, 117, 0, True),
        _lab(50885, "Bilirubin, Total", "Chemistry", "1975-2", "mg/dL", "lft", 0.7, 0.7, 0.25, 0.1, 40, 0.0, 1.5, 1, True),
        _lab(50862, "Albumin", "Chemistry", "1751-7", "g/dL", "lft", 3.2, 0.6, -0.3, 1.0, 5.5, 3.5, 5.2, 1),
    )
)

LAB_PANELS = ("chem", "cbc", "gas", "coag", "lft")
LACTATE_ITEMID = 50813
CREATININE_ITEMID = 50912

# --- SI units: how most of the world's labs report the same measurements ---
# Standard atomic weights, g/mol: IUPAC CIAAW, "Standard atomic weights of the elements 2021"
# (abridged to five significant figures; Pure Appl. Chem. 94 (2022) 573).
ATOMIC_WEIGHTS = {"H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999, "Mg": 24.305, "P": 30.974, "Ca": 40.078}


def molar_mass(formula: str) -> float:
    """Molar mass (g/mol) of a molecular formula such as 'C4H7N3O', from ATOMIC_WEIGHTS."""
    import re

    parts = re.findall(r"([A-Z][a-z]?)(\d*)", formula)
    if "".join(e + n for e, n in parts) != formula:
        raise ValueError(f"not a molecular formula: {formula!r}")
    return sum(ATOMIC_WEIGHTS[e] * int(n or 1) for e, n in parts)


# (ITEMID, SI unit, SI value per conventional (MIMIC) unit, decimals SI labs report). A mass
# concentration in mg/dL is 10 mg/L: divided by the molar mass it is mmol/L, x 1000 umol/L.
# Formulas as PubChem gives them; the factors agree with the published conversion tables
# (creatinine 88.4, glucose 0.0555, BUN -> urea 0.357, calcium 0.2495, magnesium 0.4114,
# phosphorus 0.3229, bilirubin 17.1; tests/ehr_pipeline/synth/test_synth.py checks them to 0.1 %).
SI_LAB_UNITS: tuple[tuple[int, str, float, int], ...] = (
    (CREATININE_ITEMID, "umol/L", 10_000 / molar_mass("C4H7N3O"), 0),  # 113.12 g/mol: x 88.40
    (50931, "mmol/L", 10 / molar_mass("C6H12O6"), 1),  # glucose, 180.16 g/mol: x 0.0555
    # MIMIC's urea nitrogen is mg of nitrogen; SI labs report urea, which holds two N atoms.
    (51006, "mmol/L", 10 / molar_mass("N2"), 1),  # 28.014 g/mol: x 0.3570
    (50893, "mmol/L", 10 / molar_mass("Ca"), 2),  # calcium, total: x 0.2495
    (50960, "mmol/L", 10 / molar_mass("Mg"), 2),  # magnesium: x 0.4114
    (50970, "mmol/L", 10 / molar_mass("P"), 2),  # phosphate, measured as its phosphorus: x 0.3229
    (50885, "umol/L", 10_000 / molar_mass("C33H36N4O6"), 0),  # bilirubin, total, 584.67 g/mol: x 17.10
    (50862, "g/L", 10.0, 0),  # albumin: g/dL -> g/L
    (51222, "g/L", 10.0, 0),  # hemoglobin: g/dL -> g/L
)


@dataclasses.dataclass(frozen=True)
class ChartConcept:
    """A charted measurement with its CareVue and MetaVision item ids (two D_ITEMS rows)."""

    name: str
    cv_itemid: int
    cv_label: str
    cv_uom: str | None  # CHARTEVENTS.VALUEUOM as CareVue writes it
    mv_itemid: int
    mv_label: str
    mv_abbrev: str
    mv_category: str
    mv_uom: str | None
    centre: float
    sd: float
    shift: float  # per SD of severity
    lo: float
    hi: float
    decimals: int
    neonate_offset: float = 0.0  # newborn physiology differs (fast heart, low pressure)


def _cc(*args, **kw) -> ChartConcept:
    return ChartConcept(*args, **kw)


# Order matters: the vital-sign round emits these columns in this order. One declaration per concept,
# alike in shape: the catalog is data.
HR = _cc("hr", 211, "Heart Rate", "BPM", 220045, "Heart Rate", "HR", "Routine Vital Signs", "bpm",
         85, 12, 9, 30, 200, 0, neonate_offset=50)
ABP_SYS = _cc("abp_sys", 51, "Arterial BP [Systolic]", "mmHg", 220050, "Arterial Blood Pressure systolic",
              "ABPs", "Routine Vital Signs", "mmHg", 122, 15, -9, 50, 230, 0, neonate_offset=-50)
ABP_DIA = _cc("abp_dia", 8368, "Arterial BP [Diastolic]", "mmHg", 220051, "Arterial Blood Pressure diastolic",
              "ABPd", "Routine Vital Signs", "mmHg", 62, 10, -4, 20, 140, 0, neonate_offset=-22)
ABP_MEAN = _cc("abp_mean", 52, "Arterial BP Mean", "mmHg", 220052, "Arterial Blood Pressure mean",
               "ABPm", "Routine Vital Signs", "mmHg", 82, 10, -6, 25, 170, 0)
NBP_SYS = _cc("nbp_sys", 455, "NBP [Systolic]", "mmHg", 220179, "Non Invasive Blood Pressure systolic",
              "NBPs", "Routine Vital Signs", "mmHg", 122, 15, -9, 50, 230, 0, neonate_offset=-50)
NBP_DIA = _cc("nbp_dia", 8441, "NBP [Diastolic]", "mmHg", 220180, "Non Invasive Blood Pressure diastolic",
              "NBPd", "Routine Vital Signs", "mmHg", 62, 10, -4, 20, 140, 0, neonate_offset=-22)
NBP_MEAN = _cc("nbp_mean", 456, "NBP Mean", "mmHg", 220181, "Non Invasive Blood Pressure mean",
               "NBPm", "Routine Vital Signs", "mmHg", 82, 10, -6, 25, 170, 0)
RESP = _cc("resp", 618, "Respiratory Rate", "BPM", 220210, "Respiratory Rate", "RR", "Respiratory",
           "insp/min", 18, 4, 2.5, 4, 60, 0, neonate_offset=25)
SPO2 = _cc("spo2", 646, "SpO2", "%", 220277, "O2 saturation pulseoxymetry", "SpO2", "Respiratory", "%",
           97, 2, -1.2, 60, 100, 0)
TEMP_F = _cc("temp_f", 678, "Temperature F", "Deg. F", 223761, "Temperature Fahrenheit", "Temperature F",
             "Routine Vital Signs", "?F", 98.4, 1.0, 0.4, 90, 106, 1)
WEIGHT = _cc("weight", 762, "Admit Wt", "kg", 226512, "Admission Weight (Kg)", "Admission Weight (Kg)",
             "General", "kg", 80, 18, 0, 35, 250, 1)

# Systolic items are the ones the mortality model takes the minimum of.
HR_ITEMIDS = (HR.cv_itemid, HR.mv_itemid)
SBP_ITEMIDS = (ABP_SYS.cv_itemid, NBP_SYS.cv_itemid, ABP_SYS.mv_itemid, NBP_SYS.mv_itemid)

# Glasgow coma scale: CareVue charts the total, MetaVision three text components whose
# VALUENUM is the sub-score. Text choices are indexed by score (index 0 = score 1).
GCS_TOTAL_CV = (198, "GCS Total")
GCS_MV = (
    (220739, "GCS - Eye Opening", "Eye Opening",
     ("No Response", "To Pain", "To Speech", "Spontaneously")),
    (223900, "GCS - Verbal Response", "Verbal Response",
     ("No Response-ETT", "Incomprehensible sounds", "Inappropriate Words", "Confused", "Oriented")),
    (223901, "GCS - Motor Response", "Motor Response",
     ("No response", "Abnormal extension", "Abnormal Flexion", "Flex-withdraws", "Localizes Pain",
      "Obeys Commands")),
)


@dataclasses.dataclass(frozen=True)
class FluidItem:
    """An OUTPUTEVENTS / INPUTEVENTS item: amounts are lognormal around ``median`` (units)."""

    itemid: int
    label: str
    dbsource: str  # carevue | metavision
    linksto: str  # outputevents | inputevents_cv | inputevents_mv
    uom: str
    median: float
    spread: float  # SD of log amount
    rate_per_hour: float  # events per ICU hour at severity 0
    rate_gain: float  # multiplies the rate by exp(gain * severity)
    category: str | None = None  # MetaVision D_ITEMS.CATEGORY
    rate_uom: str | None = None  # infusions only
    median_rate: float = 0.0
    route: str | None = None  # CareVue ORIGINALROUTE
    order_category: str | None = None  # MetaVision ORDERCATEGORYNAME
    order_description: str | None = None  # MetaVision ORDERCATEGORYDESCRIPTION
    duration_min: float = 1.0  # MetaVision ENDTIME - STARTTIME, minutes (median)
    amount_shift: float = 0.0  # change of the log amount per SD of severity


OUTPUT_ITEMS: tuple[FluidItem, ...] = (
    FluidItem(40055, "Urine Out Foley", "carevue", "outputevents", "ml", 70, 0.55, 0.9, -0.15,
              amount_shift=-0.35),
    FluidItem(40054, "Stool Out Stool", "carevue", "outputevents", "ml", 150, 0.7, 0.04, 0.0),
    FluidItem(226559, "Foley", "metavision", "outputevents", "mL", 70, 0.55, 0.9, -0.15, "Output",
              amount_shift=-0.35),
    FluidItem(226579, "Stool", "metavision", "outputevents", "mL", 150, 0.7, 0.04, 0.0, "Output"),
)
URINE_ITEMIDS = (40055, 226559)

INPUT_ITEMS: tuple[FluidItem, ...] = (
    FluidItem(30018, ".9% Normal Saline", "carevue", "inputevents_cv", "ml", 250, 0.6, 0.15, 0.2,
              route="Intravenous Infusion"),
    FluidItem(30013, "D5W", "carevue", "inputevents_cv", "ml", 60, 0.6, 0.08, 0.0,
              route="Intravenous Infusion"),
    FluidItem(30056, "Po Intake", "carevue", "inputevents_cv", "ml", 240, 0.5, 0.1, -0.4, route="Oral"),
    FluidItem(30047, "Levophed", "carevue", "inputevents_cv", "mg", 0.4, 0.6, 0.02, 1.4,
              rate_uom="mcgkgmin", median_rate=0.08, route="Intravenous Infusion", amount_shift=0.3),
    FluidItem(30045, "Insulin", "carevue", "inputevents_cv", "U", 4, 0.5, 0.05, 0.2,
              rate_uom="Uhr", median_rate=3, route="Intravenous Infusion"),
    FluidItem(225158, "NaCl 0.9%", "metavision", "inputevents_mv", "ml", 250, 0.6, 0.15, 0.2,
              "Fluids/Intake", "mL/hour", 75, order_category="02-Fluids (Crystalloids)",
              order_description="Continuous IV", duration_min=180),
    FluidItem(220949, "Dextrose 5%", "metavision", "inputevents_mv", "ml", 60, 0.6, 0.08, 0.0,
              "Fluids/Intake", "mL/hour", 20, order_category="01-Drips",
              order_description="Continuous Med", duration_min=120),
    FluidItem(225799, "Gastric Meds", "metavision", "inputevents_mv", "ml", 60, 0.5, 0.1, -0.4,
              "Fluids/Intake", order_category="14-Oral/Gastric Intake", order_description="Bolus"),
    FluidItem(221906, "Norepinephrine", "metavision", "inputevents_mv", "mg", 0.4, 0.6, 0.02, 1.4,
              "Medications", "mcg/kg/min", 0.08, order_category="01-Drips",
              order_description="Continuous Med", duration_min=90, amount_shift=0.3),
    FluidItem(223258, "Insulin - Regular", "metavision", "inputevents_mv", "units", 4, 0.5, 0.05, 0.2,
              "Medications", order_category="06-Insulin (Non IV)", order_description="Drug Push"),
)


@dataclasses.dataclass(frozen=True)
class Drug:
    """One PRESCRIPTIONS line template. Codes (formulary, NDC) are synthetic placeholders."""

    drug_type: str  # MAIN | BASE | ADDITIVE
    drug: str
    formulary_cd: str
    strength: str
    dose: str
    dose_unit: str
    form_val: str
    form_unit: str
    route: str
    weight: float  # relative frequency at severity 0
    severity_gain: float = 0.0  # multiplies the weight by exp(gain * severity)


DRUGS: tuple[Drug, ...] = (
    Drug("MAIN", "Heparin", "HEPA5I", "5000 Units / mL- 1mL Vial", "5000", "UNIT", "1", "mL", "SC", 8),
    Drug("MAIN", "Pantoprazole", "PANT40T", "40mg Tablet", "40", "mg", "1", "TAB", "PO", 6),
    Drug("MAIN", "Docusate Sodium", "DOCU100C", "100mg Capsule", "100", "mg", "1", "CAP", "PO", 5),
    Drug("MAIN", "Senna", "SENN8T", "1 Tablet", "1", "TAB", "1", "TAB", "PO/NG", 4),
    Drug("MAIN", "Acetaminophen", "ACET325T", "325mg Tablet", "650", "mg", "2", "TAB", "PO", 6),
    Drug("MAIN", "Aspirin", "ASPI81T", "81mg Tablet", "81", "mg", "1", "TAB", "PO", 4),
    Drug("MAIN", "Metoprolol Tartrate", "METO25T", "25mg Tablet", "25", "mg", "1", "TAB", "PO", 4),
    Drug("MAIN", "Furosemide", "FURO20I", "20mg/2mL Vial", "20", "mg", "1", "VIAL", "IV", 3, 0.3),
    Drug("MAIN", "Insulin", "INSU100I", "100 Units / mL - 10 mL Vial", "0", "UNIT", "0", "VIAL", "SC", 4),
    Drug("MAIN", "Ondansetron", "ONDA2I", "2mg/mL-2mL", "4", "mg", "2", "mL", "IV", 3),
    Drug("MAIN", "Potassium Chloride", "KCL20P", "20mEq Packet", "40", "mEq", "2", "PKT", "PO", 3),
    Drug("MAIN", "Magnesium Sulfate", "MAGS2P", "2 g / 50 mL Premix Bag", "2", "gm", "1", "BAG", "IV", 3),
    Drug("MAIN", "Vancomycin", "VANC1F", "1g Frozen Bag", "1000", "mg", "1", "BAG", "IV", 2, 0.7),
    Drug("MAIN", "Piperacillin-Tazobactam", "PIPT45F", "4.5 g Frozen Bag", "4.5", "g", "1", "BAG", "IV", 1.5, 0.7),
    Drug("MAIN", "NORepinephrine", "NORE4I", "4mg/4mL Ampule", "0.03", "mcg/kg/min", "0.3", "AMP", "IV DRIP", 0.5, 1.5),
    Drug("MAIN", "Albuterol Inhaler", "ALBU17H", "17g Inhaler", "2", "PUFF", "0.2", "INH", "IH", 2),
    Drug("BASE", "0.9% Sodium Chloride", "NS1000", "1000mL Bag", "1000", "mL", "1000", "mL", "IV", 4, 0.3),
    Drug("BASE", "D5W", "D5W250", "250 mL Bag", "250", "mL", "250", "mL", "IV", 2),
    Drug("BASE", "SW", "SW100", "100mL Bag", "100", "mL", "100", "mL", "IV", 1.5),
    Drug("ADDITIVE", "Potassium Chloride", "KCLADD", "2mEq/mL-20mL Vial", "20", "mEq", "10", "mL", "IV", 0.3),
)
# Comfort care at the end of life; its date-only STARTDATE can fall before the trigger
# even when the order was written after it (see docs/synthetic.md, "leakage traps").
COMFORT_DRUG = Drug("MAIN", "Morphine Sulfate", "MORP2I", "2mg Syringe", "2", "mg", "1", "SYR", "IV", 0)

# --- ICD-9 codes (stored without the dot, as in MIMIC) ---
# Chronic conditions a patient carries from admission to admission; those coded on a
# PRIOR admission enter the mortality model (history known before the trigger).
CHRONIC_DX = ("4280", "42731", "41401", "496", "5856", "25000")
CHRONIC_PREVALENCE = (0.18, 0.2, 0.2, 0.1, 0.05, 0.2)
BACKGROUND_DX = ("4019", "2724", "53081", "3051", "V5861", "2449", "311")
# Acute codes, more likely the sicker the admission (discharge codes: post-trigger info).
ACUTE_DX = ("0389", "99592", "78552", "5849", "51881", "486", "5990", "2762", "2851", "34830")
TERMINAL_DX = "4275"  # cardiac arrest, coded mostly on admissions that end in death
NEONATE_DX = ("V3000", "V3001", "7742", "V290", "V053")

PROCEDURES = ("3893", "9604", "9671", "9672", "3995", "9904", "3891", "4513", "3491", "9390", "8856",
              "3722")
# Procedures tied to severity (lines, intubation, ventilation, dialysis).
SEVERE_PROCEDURES = frozenset({"3893", "9604", "9671", "9672", "3995", "3891"})
NEONATE_PROCEDURES = ("9955", "9983", "640")

# --- admission-level vocabularies (MIMIC-III spellings) ---
ADMISSION_DIAGNOSES = ("SEPSIS", "PNEUMONIA", "CONGESTIVE HEART FAILURE", "GASTROINTESTINAL BLEED",
                       "ALTERED MENTAL STATUS", "CHEST PAIN", "ACUTE RENAL FAILURE",
                       "S/P FALL, SUBDURAL HEMATOMA", "CORONARY ARTERY DISEASE\\CATH",
                       "HYPOTENSION;TELEMETRY", "RESPIRATORY FAILURE", 'FEVER "R/O SEPSIS"')
CAREUNITS = ("MICU", "SICU", "CCU", "CSRU", "TSICU")
CAREUNIT_WEIGHTS = (0.45, 0.17, 0.15, 0.13, 0.10)
WARDS = (7, 12, 14, 15, 23, 33, 50, 52, 57)
NICU_WARD = 56
INSURANCES = ("Medicare", "Private", "Medicaid", "Government", "Self Pay")
LANGUAGES = ("ENGL", "SPAN", "RUSS", "PTUN", "CANT")
RELIGIONS = ("CATHOLIC", "NOT SPECIFIED", "UNOBTAINABLE", "PROTESTANT QUAKER", "JEWISH", "OTHER",
             "EPISCOPALIAN")
MARITAL = ("MARRIED", "SINGLE", "WIDOWED", "DIVORCED", "SEPARATED", "UNKNOWN (DEFAULT)")
ETHNICITIES = ("WHITE", "BLACK/AFRICAN AMERICAN", "HISPANIC OR LATINO", "ASIAN", "UNKNOWN/NOT SPECIFIED",
               "OTHER")
ETHNICITY_WEIGHTS = (0.70, 0.09, 0.04, 0.03, 0.10, 0.04)
DISCHARGE_ALIVE = ("HOME", "HOME HEALTH CARE", "SNF", "REHAB/DISTINCT PART HOSP",
                   "LONG TERM CARE HOSPITAL", "HOSPICE-HOME")
DISCHARGE_ALIVE_WEIGHTS = (0.3, 0.25, 0.25, 0.13, 0.04, 0.03)
DEAD = "DEAD/EXPIRED"


def chart_concepts() -> tuple[ChartConcept, ...]:
    """Every numeric chart concept (each has a CareVue and a MetaVision item)."""
    return (HR, ABP_SYS, ABP_DIA, ABP_MEAN, NBP_SYS, NBP_DIA, NBP_MEAN, RESP, SPO2, TEMP_F, WEIGHT)


def d_labitems_rows() -> dict[str, list]:
    """D_LABITEMS columns (without ROW_ID) for the built-in lab items."""
    return {
        "ITEMID": [i.itemid for i in LAB_ITEMS],
        "LABEL": [i.label for i in LAB_ITEMS],
        "FLUID": ["Blood"] * len(LAB_ITEMS),
        "CATEGORY": [i.category for i in LAB_ITEMS],
        "LOINC_CODE": [i.loinc for i in LAB_ITEMS],
    }


def d_items_rows() -> dict[str, list]:
    """D_ITEMS columns (without ROW_ID) for every built-in chart, output and input item.

    CareVue rows carry no abbreviation, category or unit, as in the real dictionary.
    """
    rows: list[tuple] = []
    for c in chart_concepts():
        rows.append((c.cv_itemid, c.cv_label, None, "carevue", "chartevents", None, None, None))
        rows.append((c.mv_itemid, c.mv_label, c.mv_abbrev, "metavision", "chartevents", c.mv_category,
                     c.mv_uom, "Numeric"))
    rows.append((GCS_TOTAL_CV[0], GCS_TOTAL_CV[1], None, "carevue", "chartevents", None, None, None))
    for itemid, label, abbrev, _ in GCS_MV:
        rows.append((itemid, label, abbrev, "metavision", "chartevents", "Neurological", None, "Text"))
    for f in OUTPUT_ITEMS + INPUT_ITEMS:
        if f.dbsource == "carevue":
            rows.append((f.itemid, f.label, None, "carevue", f.linksto, None, None, None))
        else:
            unit = "mL" if f.uom.lower() == "ml" else f.uom
            ptype = "Numeric" if f.linksto == "outputevents" else "Solution"
            rows.append((f.itemid, f.label, f.label, "metavision", f.linksto, f.category, unit, ptype))
    rows.sort(key=lambda r: r[0])
    names = ("ITEMID", "LABEL", "ABBREVIATION", "DBSOURCE", "LINKSTO", "CATEGORY", "UNITNAME", "PARAM_TYPE")
    return {n: [r[k] for r in rows] for k, n in enumerate(names)}


def load_dictionaries(dictionary_dir: pathlib.Path) -> dict[str, pa.Table]:
    """Reads D_ITEMS / D_LABITEMS of a real release (either dialect, gz or plain), typed.

    Returns only the tables found. Rows the reader rejects are left out (and logged by it).
    """
    out: dict[str, pa.Table] = {}
    for name in ("D_ITEMS", "D_LABITEMS"):
        try:
            path = reader.locate_table(dictionary_dir, name)
        except reader.MissingTableError:
            path = None
        if path is None:
            log.warning("dictionary %s not found in %s; using the built-in catalogue", name, dictionary_dir)
            continue
        out[name], _ = reader.read_table(path, name)
    return out


def arrow_type(t: table_schemas.ColType) -> pa.DataType:
    """The Arrow type the generator writes a schema column type as."""
    return {
        table_schemas.ColType.INT: pa.int64(),
        table_schemas.ColType.FLOAT: pa.float64(),
        table_schemas.ColType.TIMESTAMP: pa.timestamp("s"),
        table_schemas.ColType.STR: pa.string(),
    }[t]
