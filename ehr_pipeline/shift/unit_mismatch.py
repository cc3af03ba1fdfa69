"""A model's units against a data folder's: which codes differ, their conversion, and records converted.

The Beam job moves every numeric value to its code's canonical unit, the unit most of that
release's rows used unless ``--units-from MODEL_DIR`` names the model's (units.json "canonical").
Data prepared without it at another site holds, say, glucose in mmol/L where the model learnt
mg/dL: every value of the code is read 18 times too small. ``mismatches`` lists such codes with the
conversion between the two units (``units.Converter``, molar masses by LOINC) or why there is none;
the shift report names them (``findings.unit_mismatches``) and ``ehr-eval`` converts the
records it scores (``convert_records``) or refuses them.

Protobuf alone (no TensorFlow): a record is parsed, its per-code value aggregates of the
mismatched codes moved to the model's unit, and written back deterministically.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from ehr_pipeline.contract import protos, spec
from ehr_pipeline.encode import units

# The per-code value aggregates of a bag; each moves by the code's conversion (all affine, scale > 0,
# so a minimum stays a minimum).
VALUE_FEATURES = (spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST, spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One code whose data values are in another unit than the model's."""

    code: str
    data_unit: str
    model_unit: str
    conversion: units.Conversion | None  # data unit -> model unit; None: not convertible (why says)
    why: str = ""

    def describe(self) -> str:
        """'lab:50931 mmol/L -> mg/dL (x18.02)', or '... cannot be converted (why)'."""
        head = f"{self.code} {self.data_unit} -> {self.model_unit}"
        if self.conversion is None:
            return f"{head} cannot be converted ({self.why})"
        offset = f" + {self.conversion.offset:.4g}" if self.conversion.offset else ""
        return f"{head} (x{self.conversion.scale:.4g}{offset})"


def mismatches(model_units: Mapping[str, str], data_units: Mapping[str, str], converter: units.Converter,
               loinc: Mapping[str, str]) -> list[Mismatch]:
    """The codes (sorted) whose data unit is not the model's, nor another name of it (mEq/L and mmol/L of sodium).

    model_units / data_units: code -> canonical unit (each units.json's "canonical"); loinc: code ->
    LOINC, for the molar mass of mass <-> substance conversions.
    """
    out = []
    for code, model_unit in sorted(model_units.items()):
        data_unit = data_units.get(code)
        if not data_unit or converter.key(data_unit) == converter.key(model_unit):
            continue
        conversion, why = converter.conversion(data_unit, model_unit, loinc.get(code))
        if conversion is not None and conversion.identity:
            continue
        out.append(Mismatch(code, data_unit, model_unit, conversion, why))
    return out


def convert_records(records: Iterable[bytes], conversions: Mapping[str, units.Conversion]) -> tuple[list[bytes], int]:
    """(`records` with the values of `conversions`' codes in the model's units, bag entries converted).

    A bag entry is one code's values in one bag (its mean, last, min and max move together).
    A record without such a code is returned as it was, byte for byte.
    """
    wanted = {code.encode("utf-8"): conversion for code, conversion in conversions.items()}
    out, converted = [], 0
    for record in records:
        example = protos.SequenceExample.FromString(record)
        lists = example.feature_lists.feature_list
        touched = 0
        for bag, codes in enumerate(lists[spec.BAG_CODES].feature):
            valued = lists[spec.BAG_VALUE_COUNT].feature[bag].int64_list.value
            for j, code in enumerate(codes.bytes_list.value):
                conversion = wanted.get(code)
                if conversion is None or not valued[j]:
                    continue
                for key in VALUE_FEATURES:
                    column = lists[key].feature[bag].float_list.value
                    column[j] = float(conversion.apply(float(column[j])))
                touched += 1
        converted += touched
        out.append(example.SerializeToString(deterministic=True) if touched else record)
    return out, converted
