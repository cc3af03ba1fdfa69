"""MIMIC-III or MEDS -> bagged SequenceExamples: the data layer of ehr-uncertainty.

It stands on ``ehr_base`` (imported first, so the Keras flavour is pinned and TensorFlow's start-up
lines are quiet before anything loads TensorFlow). ``__version__`` is the project's one version,
kept in ``ehr_base`` and named here because pyproject.toml reads it from the data package.
"""
from ehr_base import __version__

__all__ = ["__version__"]
