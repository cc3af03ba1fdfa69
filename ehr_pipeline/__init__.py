"""MIMIC-III or MEDS -> bagged SequenceExamples: the data layer of ehr-uncertainty.

It stands on ``ehr_base`` (imported first, so the Keras flavour is pinned and TensorFlow's start-up
lines are quiet before anything loads TensorFlow). ``__version__`` is the project's one version,
kept in ``ehr_base`` and named here because pyproject.toml reads it from the data package.

The package is ten rooms on six floors (docs/architecture.md): ``contract`` at the bottom,
``reader`` and ``encode`` above it, then ``mimic``, ``shift`` and ``synth``, ``meds`` and
``fhir``, the Beam jobs in ``job`` and the command line in ``cli``. A module imports only its own
room and lower floors; this file imports none of them.
"""
from ehr_base import __version__

__all__ = ["__version__"]
