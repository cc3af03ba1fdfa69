"""`make demo`: the job end to end on the MIMIC-III demo."""
from __future__ import annotations

import logging
import pathlib
import time

from ehr_pipeline.contract import PipelineConfig
from ehr_pipeline.job import format_manifest_summary, run_job

log = logging.getLogger(__name__)


def run(mimic_dir: str, out_dir: str) -> int:
    """Bags the demo release into out_dir/data and prints the manifest summary; returns the exit code."""
    data_dir = pathlib.Path(out_dir) / "data"
    print(f"== 1. Beam job: {mimic_dir} -> {data_dir}")
    started = time.time()
    # The demo has ~90 adult admissions: one shard per split keeps the output readable.
    config = PipelineConfig.model_validate(
        {"num_shards": {"train": 1, "validation": 1, "test": 1}, "vocab": {"min_count": 2}})
    # A re-run of the demo replaces its own data folder (never one another command wrote, output_folder).
    manifest = run_job(mimic_dir, str(data_dir), config, overwrite=True)
    print(format_manifest_summary(manifest))
    print(f"   ({time.time() - started:.1f} s)")
    return 0 if manifest["balanced"] else 1
