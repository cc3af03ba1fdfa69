"""MIMIC-III -> bagged SequenceExamples: the data layer of ehr-uncertainty.

Importing this package is the single place that pins the Keras flavour: edward2 and
TensorFlow Probability speak the Keras 2 API (``tf-keras``), and TensorFlow reads
``TF_USE_LEGACY_KERAS`` only once, on its first import. Every entry point, the model and
the service import this package first (they sit above it), and so do the tests.
"""
import os as _os

_os.environ["TF_USE_LEGACY_KERAS"] = "1"
# TensorFlow's C++ start-up chatter hides our own logs; users can still raise it.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The package's one version: pyproject.toml reads it from here, and CHANGELOG.md has a section for it.
__version__ = "0.1.0"
