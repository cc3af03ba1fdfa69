"""Synthetic MIMIC-III v1.4 releases with a known, learnable mortality truth.

``generate_release`` writes the 13 tables the job reads (real file names, either CSV
dialect) plus ``SYNTH_TRUTH.csv``; ``add_arguments`` / ``run`` are the CLI hook.
The generative model and its truths (the linear family in ``truth``, the temporal family in
``temporal``, the sites whose truth differs in ``site``) are documented in docs/synthetic.md.

The modules: ``config`` types one release's settings; ``catalog`` holds the built-in items;
``cohort`` draws patients and their admission timelines; ``truth``, ``temporal`` and ``site``
decide who dies and how a hospital records it; ``events`` and ``coding`` draw the timed events
and the undated records; ``blocks`` keeps rows in memory and ``generator`` turns a chunk of
patients into Arrow tables; ``writer`` streams them into per-table files in either dialect and
``release`` drives the whole; ``recompute`` recomputes the truth's inputs from a written
release; ``counterfactual`` copies a temporal release with its trajectories changed and records the
truth's answer before and after; ``cli`` is ``ehr-pipeline synth`` and ``synth-counterfactual``.
"""
from ehr_pipeline.synth.cli import add_arguments, run
from ehr_pipeline.synth.config import SynthConfig
from ehr_pipeline.synth.release import SynthSummary, generate_release, write_release

__all__ = ["SynthConfig", "SynthSummary", "add_arguments", "generate_release", "run", "write_release"]
