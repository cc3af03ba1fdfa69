"""Do the outcomes that arrived say the model is wrong here? Observed/expected deaths with an exact interval,
tested at looks spaced so that watching a stream forever keeps its false-alarm rate at alpha.

The test: O deaths observed among n outcomes whose predictions expected E = sum p deaths. O is
a sum of Bernoulli(p_i); its exact (Garwood) Poisson interval, divided by E, is the interval of
O/E. The Poisson interval is conservative for a sum of Bernoullis (its variance E exceeds
sum p(1 - p)), which costs a little power and never a false alarm.

A monitor reads the outcomes again and again; a 95 % test after every outcome would fire on a
calibrated model sooner or later. So the test is made only at looks, after LOOKS[k] outcomes, at
level alpha * 2^-(k+1): the levels sum to alpha over an endless stream (Bonferroni), so a
calibrated model's stream raises a false alarm with probability at most alpha, however long it
runs. Between looks the last look's answer stands.
"""
from __future__ import annotations

from typing import Any

from scipy import stats

from model.evaluation.statistics import metrics

ALPHA = 0.05
# Outcomes at which the test looks: 100, 200, 400, ... doubling (a look at fewer than 100
# outcomes of a 10 % mortality expects 10 deaths: too few for an O/E to say much).
FIRST_LOOK = 100


def looks(n: int) -> list[int]:
    """The look points (outcome counts) reached by n outcomes: FIRST_LOOK, 2 FIRST_LOOK, 4 FIRST_LOOK, ... <= n."""
    out, k = [], FIRST_LOOK
    while k <= n:
        out.append(k)
        k *= 2
    return out


def look_level(index: int, alpha: float = ALPHA) -> float:
    """The two-sided test level at look `index` (0-based): alpha * 2^-(index + 1)."""
    return alpha * 2.0 ** -(index + 1)


def poisson_interval(observed: int, alpha: float) -> tuple[float, float]:
    """Exact (Garwood) two-sided (1 - alpha) interval of a Poisson mean given `observed` events."""
    if observed < 0:
        raise ValueError(f"observed must be >= 0, got {observed}")
    lower = 0.0 if observed == 0 else stats.chi2.ppf(alpha / 2.0, 2 * observed) / 2.0
    upper = stats.chi2.ppf(1.0 - alpha / 2.0, 2 * observed + 2) / 2.0
    return float(lower), float(upper)


def observed_expected(p, y, alpha: float = ALPHA) -> dict[str, Any]:
    """O/E deaths of predictions p on outcomes y with its exact (1 - alpha) interval."""
    p, y = metrics.as_pair(p, y)
    observed, expected = int(y.sum()), float(p.sum())
    if expected <= 0:
        raise ValueError("the predictions expect no deaths: O/E is undefined")
    lower, upper = poisson_interval(observed, alpha)
    return {"n": int(y.size), "observed": observed, "expected": expected, "ratio": observed / expected,
            "lower": lower / expected, "upper": upper / expected, "level": 1.0 - alpha}


def oe_alarm(p, y, alpha: float = ALPHA) -> dict[str, Any]:
    """The O/E test at the last look the outcomes (in arrival order) reached, and what it says in words.

    "fires": the look's interval excludes 1; "direction": "under-predicts" (O/E > 1) or
    "over-predicts"; "first_fired_at": the first look whose test fired (None if none).
    """
    p, y = metrics.as_pair(p, y)
    reached = looks(y.size)
    if not reached:
        return {"fires": False, "direction": None, "look": None, "first_fired_at": None, "n": int(y.size),
                "words": f"{y.size} outcomes: the first O/E test looks at {FIRST_LOOK}"}
    first = None
    for index, k in enumerate(reached):
        test = observed_expected(p[:k], y[:k], look_level(index, alpha))
        fires = not test["lower"] <= 1.0 <= test["upper"]
        if fires and first is None:
            first = k
    direction = None if not fires else ("under-predicts" if test["ratio"] > 1.0 else "over-predicts")
    interval = f"O/E {test['ratio']:.2f} [{test['lower']:.2f}, {test['upper']:.2f}] over {k} outcomes"
    words = (f"the model {direction} deaths at this site: {interval}" if fires else
             f"no evidence that the model mis-predicts deaths here: {interval}")
    return {"fires": fires, "direction": direction, "look": k, "test": test, "first_fired_at": first,
            "n": int(y.size), "alpha": alpha, "words": words + f" ({100 * test['level']:.2f}% exact interval)"}


def first_alarm(p, y, alpha: float = ALPHA) -> int | None:
    """The number of outcomes (a look) at which a stream's alarm first fires, or None: the bench's alarm delay."""
    p, y = metrics.as_pair(p, y)
    for index, k in enumerate(looks(y.size)):
        test = observed_expected(p[:k], y[:k], look_level(index, alpha))
        if not test["lower"] <= 1.0 <= test["upper"]:
            return k
    return None
