"""ehr-adapt's use case: export + local data (a data folder or the service's outcome store) + settings -> the
updated export and a summary."""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib

from ehr_pipeline.contract import output_folder
from model.adapt.config import AdaptConfig
from model.adapt.export_update import write_update
from model.adapt.local_data import read_local, read_outcomes
from model.adapt.update import adapt
from model.evaluation.statistics import metrics
from model.export.load import LoadedExport, load_export

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class UpdateResult:
    """Where the updated export is and what the update did (its adaptation.json, read back)."""

    export_dir: pathlib.Path
    adaptation: dict
    export: LoadedExport  # the written export as read back (what ehr-serve and ehr-eval will see)

    def summary(self) -> str:
        """A few lines for the console: method, choice, local data, the stored recalibration, the export."""
        a = self.adaptation
        lines = [f"{a['method']}: {a['n']} local admissions ({a['events']} deaths) of {a['parent_name']}"]
        if "closed_test" in a:
            tests = "; ".join(f"revision vs {t['simpler']}: LR {t['statistic']:.2f} (df {t['df']}), "
                              f"p {t['p_value']:.3g}" for t in a["closed_test"]["tests"])
            lines.append(f"closed test chose {a['closed_test']['step']} ({tests})")
        if "fit" in a:
            fit = a["fit"]
            lines.append(f"validation NLL {fit['validation_nll'][0]:.4f} -> {fit['validation_nll'][fit['best_epoch']]:.4f}"
                         f" (epoch {fit['best_epoch']} kept, {fit['steps']} steps)")
        r = a["recalibration"]
        lines.append(f"stored recalibration: logit -> {r['intercept']:+.4f} + {r['slope']:.4f} * logit")
        lines.append(f"local NLL after the update (in-sample): {a['local_nll']:.4f}")
        lines.append(f"updated export: {self.export_dir}")
        return "\n".join(lines)


def run_update(model_dir: str | os.PathLike[str] | LoadedExport, data_dir: str | os.PathLike[str],
               out_dir: str | os.PathLike[str], config: AdaptConfig, *, progress: bool = False, overwrite: bool = False,
               from_outcomes: bool = False) -> UpdateResult:
    """Loads the export (or takes it loaded), reads the local admissions, updates with config.method and writes
    the updated export.

    data_dir is a data folder (its config.split is read), or with ``from_outcomes`` the service's outcome
    store folder (--outcome-dir; the admissions it kept that the export's model version answered).

    out_dir is written whole once the update is complete; an earlier export there is replaced only with
    ``overwrite``, and any other folder is refused before the update starts (output_folder.check_target).
    """
    # A loaded export is read, never changed: a caller holding one spares its load (seconds: every checksum).
    loaded = model_dir if isinstance(model_dir, LoadedExport) else None
    model_dir = loaded.path if loaded is not None else model_dir
    output_folder.check_target(out_dir, kind=output_folder.MODEL_EXPORT, overwrite=overwrite,
                               inputs=[str(model_dir), str(data_dir)])
    loaded = loaded or load_export(model_dir)
    local = (read_outcomes(loaded, data_dir, sample_size=config.sample_size, seed=config.seed) if from_outcomes else
             read_local(loaded, data_dir, config.split, sample_size=config.sample_size, seed=config.seed))
    update = adapt(loaded, local, config, progress=progress)
    update.record["local_nll"] = float(metrics.mixture_nll(update.probs, local.sample.labels))
    export_dir = write_update(out_dir, loaded, local, update, config, overwrite=overwrite)
    written = load_export(export_dir)  # read back through the one reader: what ehr-serve and ehr-eval will see
    log.info("wrote %s (%s, parent %s)", export_dir, config.method, loaded.files.checksum[:12])
    return UpdateResult(export_dir, dict(written.files.adaptation.model_dump()), written)
