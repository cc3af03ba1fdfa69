"""`ehr-pipeline`, the data layer's command line: one module per sub-command that needs more than a few lines.

The modules: ``main`` builds the parser, checks the command line before any work starts and
dispatches each sub-command (summarize, synth, run, to-meds, shard, to-fhir, demo);
``run_command`` holds the flags of ``ehr-pipeline run`` (the Beam job; unknown flags are Beam's)
and runs it; ``demo`` runs the job end to end on the MIMIC-III demo. Beam is imported only by
the sub-commands that run a job, so ``--help`` and the answers to a misuse stay quick.
"""
from __future__ import annotations

from ehr_pipeline.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
