"""The closed testing procedure that picks a rung of the updating ladder (Vergouwe et al., Stat Med 2017).

Four nested models of the local outcomes, each fitted by maximum likelihood on the same
admissions: the original model (0 free parameters), recalibration in the large (1), logistic
recalibration (2) and model revision (p: every coefficient of the linear predictor re-estimated;
for the deep model, the layers that make the logit, model.adapt.revision). Each simpler model
is tested against revision by a likelihood-ratio test, so the overall type-I error stays at
alpha:

  1. revision vs original (df p): not significant -> keep the original;
  2. revision vs recalibration in the large (df p - 1): not significant -> recalibrate the intercept;
  3. revision vs logistic recalibration (df p - 2): not significant -> recalibrate; else revise.

Where only probabilities and outcomes exist (the service's outcome store without the admissions),
revision cannot be fitted: ``recalibration_closed_test`` runs the same procedure with logistic
recalibration as the largest model (none vs recalibrate, df 2; recalibrate-intercept vs
recalibrate, df 1), and says that revision was not tested.

Pure: log-likelihoods in, the chosen step and every test out.
"""
from __future__ import annotations

import dataclasses

from scipy import stats

ALPHA = 0.05
# The ladder's steps, simplest first: the names ehr-adapt's --method uses for the same updates.
STEPS = ("none", "recalibrate-intercept", "recalibrate", "revision")


@dataclasses.dataclass(frozen=True)
class LikelihoodRatioTest:
    """One step's test of a simpler model against revision."""

    simpler: str
    statistic: float  # 2 (log L_revision - log L_simpler), floored at 0
    df: int
    p_value: float

    def to_json(self) -> dict:
        """The test as adaptation.json records it."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ClosedTestResult:
    """The chosen step and the tests that chose it (the first not significant, or all three)."""

    step: str
    tests: tuple[LikelihoodRatioTest, ...]
    alpha: float

    def to_json(self) -> dict:
        """The choice as adaptation.json records it."""
        return {"step": self.step, "alpha": self.alpha, "tests": [t.to_json() for t in self.tests]}


def closed_test(log_likelihoods: dict[str, float], revision_parameters: int, alpha: float = ALPHA
                ) -> ClosedTestResult:
    """The Vergouwe step from each STEPS model's log-likelihood (nats, summed) and revision's free parameters."""
    missing = [s for s in STEPS if s not in log_likelihoods]
    if missing:
        raise ValueError(f"closed test needs the log-likelihood of every step, missing {missing}")
    if revision_parameters < 3:
        raise ValueError(f"revision must have more free parameters than logistic recalibration (2), "
                         f"got {revision_parameters}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    free = {"none": 0, "recalibrate-intercept": 1, "recalibrate": 2}
    tests = []
    for simpler in STEPS[:-1]:
        # A revision fit that stopped short of a simpler model's optimum is no evidence against it.
        statistic = max(0.0, 2.0 * (log_likelihoods["revision"] - log_likelihoods[simpler]))
        df = revision_parameters - free[simpler]
        test = LikelihoodRatioTest(simpler, statistic, df, float(stats.chi2.sf(statistic, df)))
        tests.append(test)
        if test.p_value >= alpha:
            return ClosedTestResult(simpler, tuple(tests), alpha)
    return ClosedTestResult("revision", tuple(tests), alpha)


def recalibration_closed_test(log_likelihoods: dict[str, float], alpha: float = ALPHA) -> ClosedTestResult:
    """The closed test among none, recalibrate-intercept and recalibrate (logistic recalibration the largest
    model): for outcomes without the admissions, where revision cannot be fitted."""
    missing = [s for s in STEPS[:-1] if s not in log_likelihoods]
    if missing:
        raise ValueError(f"closed test needs the log-likelihood of every recalibration step, missing {missing}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    tests = []
    for simpler, df in (("none", 2), ("recalibrate-intercept", 1)):
        statistic = max(0.0, 2.0 * (log_likelihoods["recalibrate"] - log_likelihoods[simpler]))
        test = LikelihoodRatioTest(simpler, statistic, df, float(stats.chi2.sf(statistic, df)))
        tests.append(test)
        if test.p_value >= alpha:
            return ClosedTestResult(simpler, tuple(tests), alpha)
    return ClosedTestResult("recalibrate", tuple(tests), alpha)
