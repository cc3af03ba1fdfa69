"""Which discharge is an admission's previous one: the rule the job, the MEDS road and the FHIR mapping share.

An admission's previous discharge is the latest discharge, at or before its ADMITTIME, of the
same subject's other stays admitted strictly before it. A stay that cannot give one is skipped
and counted, never guessed at:

* ``earlier_stay_without_discharge``: admitted earlier, no discharge recorded (a null DISCHTIME,
  a FHIR Encounter without period.end, a MEDS admission without a discharge code);
* ``earlier_stay_discharged_after_admit``: admitted earlier but discharged after this admission
  began (overlapping stays, or a DISCHTIME after the next ADMITTIME).

The stay before such a stay may still give the previous discharge (a subject with three stays whose
second has no DISCHTIME: the third's previous discharge is the first's). With none left, the
admission has no previous discharge (``spec.NO_PREVIOUS_DISCHARGE`` in its record). Times are
seconds since 1970; the job's discharges are effective ones (the later of DISCHTIME and DEATHTIME),
and a FHIR Encounter's period.end is that same time. Pure numpy, vectorised over the cohort.
"""
from __future__ import annotations

import dataclasses

import numpy as np

SKIPPED_NO_DISCHARGE = "earlier_stay_without_discharge"
SKIPPED_DISCHARGED_AFTER_ADMIT = "earlier_stay_discharged_after_admit"
WITH_PREVIOUS = "with_previous_discharge"
WITHOUT_PREVIOUS = "without_previous_discharge"
# Every count is always reported (zero included) so manifests are stable. The first two split the
# admissions; the skipped ones count admissions that had at least one such earlier stay.
COUNTS = (WITH_PREVIOUS, WITHOUT_PREVIOUS, SKIPPED_NO_DISCHARGE, SKIPPED_DISCHARGED_AFTER_ADMIT)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: == on numpy arrays is ambiguous
class PreviousDischarges:
    """Per admission asked about: its previous discharge (s) and the earlier stays skipped on the way."""

    time: np.ndarray  # int64 [n]: the previous discharge, s since 1970 (0 where `found` is False)
    found: np.ndarray  # bool [n]
    skipped_no_discharge: np.ndarray  # int64 [n]: earlier stays without a discharge
    skipped_after_admit: np.ndarray  # int64 [n]: earlier stays discharged after this admission's start

    def counts(self) -> dict[str, int]:
        """COUNTS -> admissions (the skipped ones: admissions with at least one such earlier stay)."""
        return {WITH_PREVIOUS: int(np.count_nonzero(self.found)),
                WITHOUT_PREVIOUS: int(np.count_nonzero(~self.found)),
                SKIPPED_NO_DISCHARGE: int(np.count_nonzero(self.skipped_no_discharge)),
                SKIPPED_DISCHARGED_AFTER_ADMIT: int(np.count_nonzero(self.skipped_after_admit))}

    def seconds_before(self, trigger: np.ndarray, none: int) -> np.ndarray:
        """int64 [n]: trigger (s) minus the previous discharge, `none` where there is none (the spec's feature)."""
        return np.where(self.found, np.asarray(trigger, np.int64) - self.time, np.int64(none))


def previous_discharges(subject: np.ndarray, admit: np.ndarray, stay_subject: np.ndarray, stay_admit: np.ndarray,
                        stay_discharge: np.ndarray, stay_has_discharge: np.ndarray) -> PreviousDischarges:
    """The previous discharge of each admission (subject, admit s) among the stays (subject, admit s, discharge s).

    The stays may include the admissions themselves (a stay is never earlier than itself) and stays
    outside the cohort; stay_discharge is ignored where stay_has_discharge is False.
    """
    subject, admit = np.asarray(subject, np.int64), np.asarray(admit, np.int64)
    stay_subject, stay_admit = np.asarray(stay_subject, np.int64), np.asarray(stay_admit, np.int64)
    stay_discharge = np.asarray(stay_discharge, np.int64)
    stay_has_discharge = np.asarray(stay_has_discharge, bool)
    order = np.argsort(stay_subject, kind="stable")
    s_subject, s_admit = stay_subject[order], stay_admit[order]
    s_discharge, s_has = stay_discharge[order], stay_has_discharge[order]
    lo = np.searchsorted(s_subject, subject, "left")
    n = np.searchsorted(s_subject, subject, "right") - lo
    # Every admission against every stay of its subject (a handful each).
    owner = np.repeat(np.arange(subject.size), n)
    stay = np.repeat(lo, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    earlier = s_admit[stay] < admit[owner]
    owner, stay = owner[earlier], stay[earlier]
    has = s_has[stay]
    usable = has & (s_discharge[stay] <= admit[owner])
    time = np.full(subject.size, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(time, owner[usable], s_discharge[stay][usable])
    found = np.zeros(subject.size, bool)
    found[owner[usable]] = True
    return PreviousDischarges(
        time=np.where(found, time, 0),
        found=found,
        skipped_no_discharge=np.bincount(owner[~has], minlength=subject.size).astype(np.int64),
        skipped_after_admit=np.bincount(owner[has & ~usable], minlength=subject.size).astype(np.int64))
