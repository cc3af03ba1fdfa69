"""Evaluation figures as PNG files: reliability, uncertainty vs error, risk-coverage, uncertainty histograms,
referral against a known truth.

Figures are built on matplotlib's object API with an explicit Agg canvas instead of pyplot:
pyplot keeps a global registry of open figures and picks a backend on import, and neither
suits a library that runs inside a headless CLI, a service or parallel tests. A figure is given its
numbers (computed by ``model.evaluation.statistics``, most of them read from metrics.json), so a plot never
disagrees with the table beside it; the only arithmetic left here is drawing's own (a histogram's bins of
raw values, a spectrum's share of variance).
"""
from __future__ import annotations

import os
import pathlib
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from model.evaluation.statistics import against_truth, small_sample

_DPI = 120


def _new_figure(width: float, height: float) -> Figure:
    """A figure attached to its own Agg canvas (no pyplot, no display)."""
    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _print_png(fig: Figure, target) -> None:
    """Write the figure as PNG to a path or a binary file."""
    # Figure.tight_layout leaves a placeholder layout engine behind, for which savefig draws the whole
    # figure once more (unrendered) before the real draw: a third of a figure's time, for a layout that
    # is already fixed. Without it the PNG is the same, byte for byte.
    fig.set_layout_engine(None)
    fig.savefig(target, format="png")


def _save(fig: Figure, path) -> pathlib.Path:
    """Write the figure as PNG, creating the parent folder, and return the path."""
    path = pathlib.Path(os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    _print_png(fig, path)
    return path


def reliability_diagram(bins: Mapping[str, np.ndarray], ece: float, path="reliability.png") -> pathlib.Path:
    """Accuracy vs confidence per bin (bars), the gap to the diagonal, a count histogram, ECE in the title.

    ``bins``: ``metrics.calibration_bins`` of the predictions, ``ece`` their ``metrics.ece`` on the same bins.
    """
    count = bins["count"]
    num_bins = len(count)
    filled = count > 0
    # Empty bins have no accuracy; leave their bars out instead of drawing zeros.
    acc = np.divide(bins["sum_correct"], count, out=np.zeros(num_bins), where=filled)
    conf = np.divide(bins["sum_confidence"], count, out=np.zeros(num_bins), where=filled)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    left, width = edges[:-1], 1.0 / num_bins

    fig = _new_figure(5.0, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(left[filled], acc[filled], width=width, align="edge", color="tab:blue",
            edgecolor="black", label="accuracy")
    # The gap is drawn from accuracy to the mean confidence of the bin, not to the bin centre.
    top.bar(left[filled], conf[filled] - acc[filled], bottom=acc[filled], width=width, align="edge",
            color="tab:red", alpha=0.35, edgecolor="tab:red", hatch="//", label="gap")
    top.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    top.set_ylabel("accuracy")
    top.set_ylim(0, 1)
    top.set_title(f"Reliability ({num_bins} bins, top-label)  ECE = {ece:.4f}")
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(left, count, width=width, align="edge", color="gray", edgecolor="black")
    bottom.set_xlabel("confidence max(p, 1 - p)")
    bottom.set_ylabel("count")
    # Top-label confidence never falls below 0.5, so the lower half of the axis is empty.
    bottom.set_xlim(max(0.0, left[filled].min()) if filled.any() else 0.0, 1.0)
    fig.tight_layout()
    return _save(fig, path)


def uncertainty_vs_error(
    binned: Mapping[str, np.ndarray], path="uncertainty_vs_error.png", name: str = "uncertainty"
) -> pathlib.Path:
    """Error rate and NLL in equal-count uncertainty bins: a useful uncertainty rises with both.

    ``binned``: ``metrics.error_by_uncertainty`` of the predictions and one uncertainty measure.
    """
    fig = _new_figure(6.0, 4.0)
    ax = fig.subplots()
    ax.plot(binned["mean_uncertainty"], binned["error_rate"], marker="o", color="tab:blue", label="error rate")
    ax.set_xlabel(f"{name} (bin mean, {len(binned['count'])} equal-count bins)")
    ax.set_ylabel("error rate (threshold 0.5)", color="tab:blue")
    twin = ax.twinx()
    twin.plot(binned["mean_uncertainty"], binned["nll"], marker="s", color="tab:red", label="NLL")
    twin.set_ylabel("NLL (nats)", color="tab:red")
    ax.set_title(f"Error vs {name}")
    fig.tight_layout()
    return _save(fig, path)


def _table_panels(tables: Mapping[str, Sequence[Mapping]], x_key: str, metric_names: Sequence[str], xlabel: str,
                  titles: Mapping[str, str], dashed: Sequence[str] = (), invert_x: bool = False) -> Figure:
    """One panel per metric, one line per table (rows of dicts), x from each row's `x_key`."""
    fig = _new_figure(4.5 * len(metric_names), 3.7)
    axes = np.atleast_1d(fig.subplots(1, len(metric_names)))
    for ax, metric in zip(axes, metric_names):
        for name, rows in tables.items():
            # evaluate() stores undefined values as None; plot them as gaps.
            values = [np.nan if row[metric] is None else row[metric] for row in rows]
            ax.plot([row[x_key] for row in rows], values, linestyle="--" if name in dashed else "-", marker="o",
                    markersize=3, label=name)
        ax.set_xlabel(xlabel)
        ax.set_title(titles.get(metric, metric), fontsize=9)
        if invert_x:
            ax.invert_xaxis()
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def risk_coverage_plot(
    tables: Mapping[str, Sequence[Mapping]],
    path="risk_coverage.png",
    metric_names: Sequence[str] = ("auc_pr", "auc_roc", "nll", "ece"),
) -> pathlib.Path:
    """One panel per metric vs coverage, one line per uncertainty measure (tables from selective_prediction)."""
    # Referral moves right to left: full coverage on the right like the paper's figures.
    fig = _table_panels(tables, "coverage", metric_names, "coverage (fraction kept)", {}, invert_x=True)
    return _save(fig, path)


def referral_vs_truth_plot(
    tables: Mapping[str, Sequence[Mapping]],
    path="referral_vs_truth.png",
    metric_names: Sequence[str] = ("mae_truth", "kl_truth"),
) -> pathlib.Path:
    """Kept cases' error vs the truth against the referral rate, one line per score (against_truth.selective_vs_truth).

    The dashed baselines frame the measures: "random" is flat, "oracle" is the best any measure
    can reach, "risk" refers by p; a measure earns its keep only between random and oracle.
    """
    titles = {"mae_truth": "mean |p - P_DEATH| of kept cases", "kl_truth": "mean KL(truth || p) of kept cases (nats)"}
    fig = _table_panels(tables, "referral_rate", metric_names, "referral rate", titles,
                        dashed=against_truth.REFERRAL_BASELINES)
    return _save(fig, path)


def uncertainty_histogram(
    uncertainty, correct=None, path="uncertainty_histogram.png", name: str = "uncertainty", bins: int = 30
) -> pathlib.Path:
    """Histogram of an uncertainty measure, split into correct and incorrect predictions when `correct` is given."""
    u = np.asarray(uncertainty, dtype=np.float64)
    edges = np.histogram_bin_edges(u, bins=bins)
    fig = _new_figure(6.0, 4.0)
    ax = fig.subplots()
    if correct is None:
        ax.hist(u, bins=edges, color="tab:blue")
    else:
        correct = np.asarray(correct, dtype=bool)
        # Densities, because errors are the minority and would vanish beside raw counts.
        for mask, label, color in ((correct, "correct", "tab:blue"), (~correct, "incorrect", "tab:red")):
            if mask.any():
                ax.hist(u[mask], bins=edges, density=True, alpha=0.5, color=color, label=f"{label} (n={mask.sum()})")
        ax.legend()
    ax.set_xlabel(name)
    ax.set_ylabel("density" if correct is not None else "count")
    ax.set_title(f"Distribution of {name}")
    fig.tight_layout()
    return _save(fig, path)


def singular_values_plot(spectra: Mapping[str, np.ndarray], path="singular_values.png",
                         max_rank: int = 10) -> pathlib.Path:
    """Fraction of variance gamma_i^2 / sum gamma^2 per singular value i (log scale), one line per layer."""
    fig = _new_figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for name, values in spectra.items():
        fraction = np.asarray(values, float) ** 2 / max(float(np.sum(np.square(values))), 1e-300)
        shown = fraction[:max_rank]
        ax.plot(np.arange(1, len(shown) + 1), shown, marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("singular value index")
    ax.set_ylabel("fraction of variance explained")
    ax.set_title("Posterior stddev matrices: spectrum")
    ax.legend(fontsize=7)
    return _save(fig, path)


def curves_plot(panels: Sequence[tuple[str, Mapping[str, tuple[Sequence[float], np.ndarray, np.ndarray]]]],
                xlabel: str, path="curves.png", log_y: Sequence[bool] = ()) -> pathlib.Path:
    """Side-by-side panels (title, {label: (x, mean, sem)}): mean lines with +-SEM bands."""
    fig = _new_figure(5.0 * len(panels), 4.0)
    for i, (title, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for label, (x, mean, sem) in series.items():
            mean, sem = np.asarray(mean, float), np.nan_to_num(np.asarray(sem, float))
            ax.plot(x, mean, marker="o", label=label)
            ax.fill_between(x, mean - sem, mean + sem, alpha=0.2)
        if i < len(log_y) and log_y[i]:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    return _save(fig, path)


# --------------------------------------------------------------------------- the clinical report's figures
# Drawn from the JSON sections of model.evaluation.statistics.clinical_stats (what metrics.json holds), never from the
# predictions again: the page and the file cannot disagree.

_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for pages that embed it)."""
    import io

    buffer = io.BytesIO()
    _print_png(fig, buffer)
    return buffer.getvalue()


def _none_to_nan(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def calibration_figure(models: Sequence[tuple[str, Mapping]]) -> Figure:
    """Observed vs predicted risk: LOWESS curve with its bootstrap band, binned rates with Wilson intervals, one colour per model."""
    fig = _new_figure(5.6, 5.0)
    ax = fig.subplots()
    top = 0.0
    for i, (label, cal) in enumerate(models):
        colour = _COLOURS[i % len(_COLOURS)]
        # No smoothed curve where the small-sample rule calls calibration not estimable (the page passes None).
        sm = cal["smoothed"]
        x = _none_to_nan(sm["p"]) if sm else np.array([])
        if sm:
            ax.fill_between(x, _none_to_nan(sm["lower"]), _none_to_nan(sm["upper"]), color=colour, alpha=0.18,
                            lw=0)
            slope, large = cal["slope"]["estimate"], cal["intercept"]["estimate"]
            text = "" if slope is None else f" (slope {slope:.2f}, CITL {large:+.2f})"
            ax.plot(x, _none_to_nan(sm["observed"]), color=colour, lw=2, label=f"{label}: LOWESS{text}")
        bins = cal["binned"]
        mean_p = [b["mean_p"] for b in bins]
        observed = np.array([b["observed"] for b in bins])
        # Wilson bounds of 0 / n events sit a rounding error above 0: clip, the bar is empty there.
        err = np.clip(np.array([observed - [b["lower"] for b in bins], [b["upper"] for b in bins] - observed]), 0, None)
        ax.errorbar(mean_p, observed, yerr=err, fmt="o", ms=4, color=colour, alpha=0.8, capsize=2,
                    label=f"{label}: deciles of p (95% CI)")
        top = max(top, np.nanmax(_none_to_nan(sm["upper"])) if len(x) else 0, max(b["upper"] for b in bins),
                  max(mean_p))
    top = min(1.0, 1.1 * top + 0.02)
    _diagonal_axes(ax, top, "perfect calibration", ("predicted risk of in-hospital death", "observed proportion"),
                   "Calibration", "upper left")
    fig.tight_layout()
    return fig


def _diagonal_axes(ax, top: float, diagonal: str, labels: tuple[str, str], title: str, legend: str) -> None:
    """A square [0, top] frame with its dashed y = x reference line, axis labels, title and legend."""
    ax.plot([0, top], [0, top], ls="--", color="gray", lw=1, label=diagonal)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=7, loc=legend)


def roc_figure(models: Sequence[tuple[str, Mapping]]) -> Figure:
    """The ROC curves stored in clinical.curves.roc, one per (legend label, roc), with the chance diagonal (the
    caller puts an AUC in the label only where the page shows it, rounded as the page rounds it)."""
    fig = _new_figure(4.6, 4.4)
    ax = fig.subplots()
    for i, (label, curves) in enumerate(models):
        ax.plot(curves["fpr"], curves["tpr"], color=_COLOURS[i % len(_COLOURS)], lw=2, label=label)
    _diagonal_axes(ax, 1.0, "chance", ("1 - specificity (false-positive rate)", "sensitivity (true-positive rate)"),
                   "ROC curve", "lower right")
    fig.tight_layout()
    return fig


def risk_histogram_figure(histogram: Mapping, top: float | None = None) -> Figure:
    """Deaths and survivors per predicted-risk bin (clinical.curves.histogram), stacked, on the calibration's axis."""
    fig = _new_figure(5.6, 1.9)
    ax = fig.subplots()
    edges = np.asarray(histogram["edges"], dtype=np.float64)
    width = np.diff(edges)
    survivors = np.asarray(histogram["survivors"], dtype=np.float64)
    if top is None:  # the occupied range, as the calibration figure above it shows
        filled = np.flatnonzero(survivors + np.asarray(histogram["deaths"], dtype=np.float64))
        top = min(1.0, float(edges[filled[-1] + 1]) + 0.02) if filled.size else 1.0
    ax.bar(edges[:-1], survivors, width=width, align="edge", color="#a0aec0", label="survivors")
    ax.bar(edges[:-1], histogram["deaths"], width=width, align="edge", bottom=survivors, color="#c05621",
           label="deaths")
    ax.set_xlim(0, top)
    ax.set_xlabel("predicted risk of in-hospital death")
    ax.set_ylabel("cases")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def decision_curve_figure(models: Sequence[tuple[str, Mapping]]) -> Figure:
    """Net benefit against the threshold probability: model(s), treat all, treat none; with referral, a
    second panel of the kept cases and the referral strategies in the first."""
    with_referral = any("referral_treated" in d for _, d in models)
    fig = _new_figure(10.5 if with_referral else 6.0, 4.4)
    axes = np.atleast_1d(fig.subplots(1, 2 if with_referral else 1))
    first = models[0][1]
    t = np.asarray(first["thresholds"])
    prevalence = first["prevalence"]
    ax = axes[0]
    ax.plot(t, first["treat_all"], color="gray", lw=1.2, label="treat all")
    ax.axhline(0.0, color="black", lw=1.0, label="treat none")
    for i, (label, d) in enumerate(models):
        colour = _COLOURS[i % len(_COLOURS)]
        ax.plot(t, d["model"], color=colour, lw=2, label=label)
        if "referral_treated" in d:
            share = f"{100 * d['referred_fraction']:.0f}%"
            ax.plot(t, d["referral_treated"], color=colour, lw=1.5, ls="--",
                    label=f"{label}, {share} referred and treated")
            ax.plot(t, d["referral_perfect_review"], color=colour, lw=1.2, ls=":",
                    label=f"{label}, {share} referred, review always right (bound)")
    ax.set_ylim(-0.25 * prevalence, 1.15 * prevalence)
    ax.set_xlabel("threshold probability (treat if p >= threshold)")
    ax.set_ylabel("net benefit (true positives per patient)")
    ax.set_title(f"Decision curve, all {first['n']} cases", fontsize=11)
    ax.legend(fontsize=7)
    if with_referral:
        ax = axes[1]
        kept_prev = 0.0
        for i, (label, d) in enumerate(models):
            if "kept" not in d:
                continue
            colour = _COLOURS[i % len(_COLOURS)]
            ax.plot(t, d["kept"]["treat_all"], color=colour, lw=1.0, alpha=0.6, label=f"treat all kept ({label})")
            ax.plot(t, d["kept"]["model"], color=colour, lw=2, label=f"{label} on the {d['kept']['n']} kept cases")
            kept_prev = max(kept_prev, d["kept"]["prevalence"])
        ax.axhline(0.0, color="black", lw=1.0, label="treat none")
        ax.set_ylim(-0.25 * max(kept_prev, 1e-3), 1.15 * max(kept_prev, 1e-3))
        ax.set_xlabel("threshold probability")
        ax.set_ylabel("net benefit per kept case")
        ax.set_title("Cases the model decides alone (not referred)", fontsize=11)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def selective_figure(models: Sequence[tuple[str, Mapping]], target_risk: float | None = None) -> Figure:
    """Error rate of the kept cases against coverage, one line per referral score (clinical_stats.selective_summary
    curves); one panel per model, so two models' four scores never overlap in one axes."""
    fig = _new_figure(6.2 if len(models) == 1 else 4.4 * len(models), 4.4)
    axes = np.atleast_1d(fig.subplots(1, len(models), sharey=True))
    for ax, (label, sel) in zip(axes, models):
        curve = sel["curve"]
        for j, (score, risk) in enumerate(curve["risk"].items()):
            ax.plot(curve["coverage"], _none_to_nan(risk), color=_COLOURS[j % len(_COLOURS)], lw=1.6,
                    label=f"refer by {score}" if score != "risk" else "refer highest p first")
        if target_risk is not None:
            ax.axhline(target_risk, color="gray", lw=0.8, ls=":", label=f"target error {target_risk:g}")
        ax.set_xlim(1.0, 0.0)
        ax.set_xlabel("coverage (fraction decided alone)")
        ax.set_title("Selective prediction: most uncertain referred first" if len(models) == 1 else label,
                     fontsize=11)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("error rate of the kept cases (p > 0.5 vs outcome)")
    fig.tight_layout()
    return fig


def forest_rows(subgroups: Mapping, metric_names: Sequence[tuple[str, str]]) -> list[tuple[str, str, dict]]:
    """(attribute, group, {metric: cell}) of the groups with at least one estimable cell among metric_names
    (small_sample.subgroup_estimate: the page's tables show the same cells)."""
    out = []
    for attribute, groups in subgroups["attributes"].items():
        for group, row in groups.items():
            cells = {m: small_sample.subgroup_estimate(row, m, subgroups["min_gap_cases"]) for m, _ in metric_names}
            if any(c.get("estimate") is not None for c in cells.values()):
                out.append((attribute, group, {**cells, "n": row["n"]}))
    return out


def subgroup_figure(subgroups: Mapping, metric_names: Sequence[tuple[str, str]]) -> Figure:
    """Forest plot: per subgroup, each metric's estimate and interval where estimable (forest_rows)."""
    rows = forest_rows(subgroups, metric_names)
    fig = _new_figure(3.4 * len(metric_names) + 2.2, 0.26 * len(rows) + 1.2)
    axes = np.atleast_1d(fig.subplots(1, len(metric_names), sharey=True))
    y = np.arange(len(rows))[::-1]
    labels = [f"{attribute}: {group} (n={row['n']})" for attribute, group, row in rows]
    for ax, (metric, title) in zip(axes, metric_names):
        for yi, (_, _, row) in zip(y, rows):
            cell = row[metric]
            est, lo, hi = cell.get("estimate"), cell.get("lower"), cell.get("upper")
            if est is None:
                continue
            colour = "tab:blue"
            if lo is not None and hi is not None and lo < hi:
                ax.plot([lo, hi], [yi, yi], color=colour, lw=1.5)
            ax.plot([est], [yi], "o", color=colour, ms=4)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        if metric == "observed_minus_expected":
            ax.axvline(0.0, color="gray", lw=0.8, ls="--")
    axes[0].set_yticks(y)
    axes[0].set_yticklabels(labels, fontsize=7)
    # Attribute blocks separated by a faint line.
    previous = None
    for yi, (attribute, _, _) in zip(y, rows):
        if previous is not None and attribute != previous:
            for ax in axes:
                ax.axhline(yi + 0.5, color="gray", lw=0.4, alpha=0.5)
        previous = attribute
    fig.tight_layout()
    return fig


_SEVERITY_COLOURS = {"none": "tab:gray", "moderate": "tab:orange", "severe": "tab:red"}


def shift_plot(report, path="shift.png", top: int = 15) -> pathlib.Path:
    """The shift report at a glance (ehr_pipeline.shift.ShiftReport).

    Top left: the distributions that moved most (PSI on the reference's bins, log scale),
    coloured by severity, with the 0.1 / 0.25 thresholds. Top right: the worst code's values,
    the training share per bin beside the new data's. Bottom: per source, the share of events
    out of the model's vocabulary and events per admission relative to training.
    """
    fig = _new_figure(13.0, 8.0)
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
    _shift_psi_panel(fig.add_subplot(grid[0, 0]), report, top)
    _shift_worst_panel(fig.add_subplot(grid[0, 1]), report)
    _shift_oov_panel(fig.add_subplot(grid[1, 0]), report)
    _shift_events_panel(fig.add_subplot(grid[1, 1]), report)
    fig.tight_layout()
    return _save(fig, path)


def _shift_psi_panel(ax, report, top: int) -> None:
    """The distributions that moved most, by PSI (log scale), with the severity thresholds."""
    rows = sorted(report.distributions, key=lambda r: -r["psi"])[:top][::-1]
    th = report.summary.get("thresholds", {})
    if rows:
        floor = 1e-3
        psis = [max(r["psi"], floor) for r in rows]
        ax.barh(range(len(rows)), psis, color=[_SEVERITY_COLOURS[r["severity"]] for r in rows], left=floor)
        labels = []
        for r in rows:
            if r["kind"] == "events_per_admission":
                labels.append(f"{r['subject']} events per admission (mean x{r['mean_current'] / max(r['mean_reference'], 1e-12):.2g})")
            elif r["kind"] == "case_mix":
                labels.append(f"case mix: {r['subject'].replace('_', ' ')}")
            elif r.get("median_reference") and r["median_reference"] > 0 and r.get("median_current") is not None:
                labels.append(f"{r['subject']} (median x{r['median_current'] / r['median_reference']:.3g})")
            else:
                labels.append(r["subject"])
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_xscale("log")
        for value, name in ((th.get("psi_moderate", 0.1), "moderate"), (th.get("psi_severe", 0.25), "severe")):
            ax.axvline(value, linestyle="--", color=_SEVERITY_COLOURS[name], linewidth=1)
    ax.set_xlabel("population stability index (log scale)")
    ax.set_title(f"shift: {report.level}  ({report.summary['n_current']} admissions vs "
                 f"{report.summary['n_reference']} in training)", fontsize=10)


def _shift_worst_panel(ax, report) -> None:
    """The worst-shifted code's values: the training share per bin beside the new data's."""
    worst = next((r for r in sorted(report.distributions, key=lambda r: -r["psi"]) if r["kind"] == "value_shift"),
                 None)
    if worst is not None:
        edges = worst["edges"]
        names = ([f"< {edges[0]:.3g}"] + [f"{a:.3g}-{b:.3g}" for a, b in zip(edges[:-1], edges[1:])]
                 + [f">= {edges[-1]:.3g}"]) if edges else ["all"]
        x = np.arange(len(names))
        ax.bar(x - 0.2, worst["reference_proportions"], width=0.4, color="tab:blue", label="training")
        ax.bar(x + 0.2, worst["current_proportions"], width=0.4, color=_SEVERITY_COLOURS[worst["severity"]],
               label="new data")
        ax.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("share of admissions")
        ratio = (f", median x{worst['median_current'] / worst['median_reference']:.3g}"
                 if worst.get("median_reference") and worst["median_reference"] > 0 else "")
        ax.set_title(f"{worst['subject']}: one value per admission, training deciles (PSI {worst['psi']:.2f}{ratio})",
                     fontsize=9)
        ax.legend(fontsize=8)
    else:
        ax.set_axis_off()


def _shift_oov_panel(ax, report) -> None:
    """Per source, the share of events out of the model's vocabulary."""
    oov = report.summary.get("oov_share", {})
    sources = list(oov)
    x = np.arange(len(sources))
    ax.bar(x - 0.2, [100 * oov[s]["reference"] for s in sources], width=0.4, color="tab:blue", label="training")
    ax.bar(x + 0.2, [100 * oov[s]["current"] for s in sources], width=0.4, color="tab:orange", label="new data")
    ax.set_xticks(x, sources, fontsize=8)
    ax.set_ylim(0, max([1.0] + [110 * max(v["reference"], v["current"]) for v in oov.values()]))
    ax.set_ylabel("% of events")
    ax.set_title("codes out of the model's vocabulary", fontsize=9)
    ax.legend(fontsize=8)


def _shift_events_panel(ax, report) -> None:
    """Per source, events per admission relative to training."""
    events = [r for r in report.distributions if r["kind"] == "events_per_admission" and r["mean_reference"]]
    ratios = [r["mean_current"] / r["mean_reference"] for r in events]
    bars = ax.bar(range(len(events)), ratios, color=[_SEVERITY_COLOURS[r["severity"]] for r in events])
    for bar, ratio in zip(bars, ratios):
        ax.annotate(f"x{ratio:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(events)), [r["subject"] for r in events], fontsize=8)
    ax.set_ylim(0, max([1.25] + [1.15 * r for r in ratios]))
    ax.set_ylabel("events per admission, new / training")
    mi = report.summary.get("mi_share_above_p95")
    ax.set_title("how often each source records" + (f"\n(mutual information above the validation p95 on "
                                                     f"{100 * mi:.0f}% of admissions; 5% expected)"
                                                     if mi is not None else ""), fontsize=9)
