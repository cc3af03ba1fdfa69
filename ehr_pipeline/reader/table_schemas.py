"""Typed schemas of the MIMIC-III v1.4 tables this project reads.

Column names, types and nullability follow the official v1.4 PostgreSQL DDL
(mimic-code, ``postgres_create_tables.sql``). Only the tables the job uses are listed.
A NOT NULL column that arrives empty makes the row a dead letter (``missing_required``).
"""
from __future__ import annotations

import dataclasses
import enum


class ColType(str, enum.Enum):
    """Logical column type; the reader maps each onto an Arrow type."""

    INT = "int"  # INT / SMALLINT / BIGINT in the DDL
    FLOAT = "float"  # DOUBLE PRECISION
    TIMESTAMP = "timestamp"  # TIMESTAMP(0), 'YYYY-MM-DD HH:MM:SS', read as seconds since 1970
    STR = "str"  # VARCHAR / CHAR / TEXT


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: ColType
    nullable: bool = True


@dataclasses.dataclass(frozen=True)
class TableSchema:
    name: str
    columns: tuple[Column, ...]
    # A required table missing from the release is an error; an optional one is skipped
    # with a notice (CHARTEVENTS is absent from the public demo; CareVue-only or
    # MetaVision-only extracts lack one of the INPUTEVENTS tables).
    required: bool = True

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    @property
    def file_names(self) -> tuple[str, str]:
        """The file names a release may use for this table, preferred first."""
        return (f"{self.name}.csv.gz", f"{self.name}.csv")


def _cols(spec: str) -> tuple[Column, ...]:
    """Parses 'NAME:type[!]' tokens; '!' marks NOT NULL."""
    out = []
    for tok in spec.split():
        name, _, typ = tok.partition(":")
        not_null = typ.endswith("!")
        out.append(Column(name, ColType(typ.rstrip("!")), nullable=not not_null))
    return tuple(out)



TABLES: dict[str, TableSchema] = {
    t.name: t
    for t in [
        TableSchema("ADMISSIONS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int! ADMITTIME:timestamp! DISCHTIME:timestamp! "
            "DEATHTIME:timestamp ADMISSION_TYPE:str! ADMISSION_LOCATION:str! DISCHARGE_LOCATION:str! "
            "INSURANCE:str! LANGUAGE:str RELIGION:str MARITAL_STATUS:str ETHNICITY:str! "
            "EDREGTIME:timestamp EDOUTTIME:timestamp DIAGNOSIS:str HOSPITAL_EXPIRE_FLAG:int "
            "HAS_CHARTEVENTS_DATA:int!")),
        TableSchema("PATIENTS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! GENDER:str! DOB:timestamp! DOD:timestamp "
            "DOD_HOSP:timestamp DOD_SSN:timestamp EXPIRE_FLAG:int!")),
        TableSchema("ICUSTAYS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int! ICUSTAY_ID:int! DBSOURCE:str! "
            "FIRST_CAREUNIT:str! LAST_CAREUNIT:str! FIRST_WARDID:int! LAST_WARDID:int! "
            "INTIME:timestamp! OUTTIME:timestamp LOS:float")),
        TableSchema("LABEVENTS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int ITEMID:int! CHARTTIME:timestamp "
            "VALUE:str VALUENUM:float VALUEUOM:str FLAG:str")),
        TableSchema("CHARTEVENTS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int ICUSTAY_ID:int ITEMID:int "
            "CHARTTIME:timestamp STORETIME:timestamp CGID:int VALUE:str VALUENUM:float "
            "VALUEUOM:str WARNING:int ERROR:int RESULTSTATUS:str STOPPED:str"), required=False),
        TableSchema("OUTPUTEVENTS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int ICUSTAY_ID:int CHARTTIME:timestamp "
            "ITEMID:int VALUE:float VALUEUOM:str STORETIME:timestamp CGID:int STOPPED:str "
            "NEWBOTTLE:str ISERROR:int")),
        TableSchema("INPUTEVENTS_CV", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int ICUSTAY_ID:int CHARTTIME:timestamp "
            "ITEMID:int AMOUNT:float AMOUNTUOM:str RATE:float RATEUOM:str STORETIME:timestamp "
            "CGID:int ORDERID:int LINKORDERID:int STOPPED:str NEWBOTTLE:int "
            "ORIGINALAMOUNT:float ORIGINALAMOUNTUOM:str ORIGINALROUTE:str ORIGINALRATE:float "
            "ORIGINALRATEUOM:str ORIGINALSITE:str"), required=False),
        TableSchema("INPUTEVENTS_MV", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int ICUSTAY_ID:int STARTTIME:timestamp "
            "ENDTIME:timestamp ITEMID:int AMOUNT:float AMOUNTUOM:str RATE:float RATEUOM:str "
            "STORETIME:timestamp CGID:int ORDERID:int LINKORDERID:int ORDERCATEGORYNAME:str "
            "SECONDARYORDERCATEGORYNAME:str ORDERCOMPONENTTYPEDESCRIPTION:str "
            "ORDERCATEGORYDESCRIPTION:str PATIENTWEIGHT:float TOTALAMOUNT:float "
            "TOTALAMOUNTUOM:str ISOPENBAG:int CONTINUEINNEXTDEPT:int CANCELREASON:int "
            "STATUSDESCRIPTION:str COMMENTS_EDITEDBY:str COMMENTS_CANCELEDBY:str "
            "COMMENTS_DATE:timestamp ORIGINALAMOUNT:float ORIGINALRATE:float"), required=False),
        TableSchema("PRESCRIPTIONS", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int! ICUSTAY_ID:int STARTDATE:timestamp "
            "ENDDATE:timestamp DRUG_TYPE:str! DRUG:str DRUG_NAME_POE:str DRUG_NAME_GENERIC:str "
            "FORMULARY_DRUG_CD:str GSN:str NDC:str PROD_STRENGTH:str DOSE_VAL_RX:str "
            "DOSE_UNIT_RX:str FORM_VAL_DISP:str FORM_UNIT_DISP:str ROUTE:str")),
        TableSchema("DIAGNOSES_ICD", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int! SEQ_NUM:int ICD9_CODE:str")),
        TableSchema("PROCEDURES_ICD", _cols(
            "ROW_ID:int! SUBJECT_ID:int! HADM_ID:int! SEQ_NUM:int! ICD9_CODE:str!")),
        TableSchema("D_ITEMS", _cols(
            "ROW_ID:int! ITEMID:int! LABEL:str ABBREVIATION:str DBSOURCE:str LINKSTO:str "
            "CATEGORY:str UNITNAME:str PARAM_TYPE:str CONCEPTID:int")),
        TableSchema("D_LABITEMS", _cols(
            "ROW_ID:int! ITEMID:int! LABEL:str! FLUID:str! CATEGORY:str! LOINC_CODE:str")),
    ]
}



def get(table: str) -> TableSchema:
    """Looks a table up by name, case-insensitively."""
    try:
        return TABLES[table.upper()]
    except KeyError:
        raise KeyError(f"unknown MIMIC-III table {table!r}; known: {', '.join(sorted(TABLES))}") from None
