"""Synthetic MIMIC-III v1.4 releases with a known, learnable mortality truth.

``generate_release`` writes the 13 tables the job reads (real file names, either CSV
dialect) plus ``SYNTH_TRUTH.csv``; ``add_arguments`` / ``run`` are the CLI hook.
The generative model and its truths (the linear family in ``truth``, the temporal family in
``temporal``, the sites whose truth differs in ``site``) are documented in docs/synthetic.md.
"""
from ehr_pipeline.synth.cli import add_arguments, run
from ehr_pipeline.synth.config import SynthConfig
from ehr_pipeline.synth.release import SynthSummary, generate_release, write_release

__all__ = ["SynthConfig", "SynthSummary", "add_arguments", "generate_release", "run", "write_release"]
