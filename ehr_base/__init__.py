"""The bottom of the house: what every layer shares, and nothing else.

``ehr_pipeline`` (data) <- ``model`` <- ``serving`` all stand on this package, so importing it is
the one place that:

* pins the Keras flavour: edward2 and TensorFlow Probability speak the Keras 2 API
  (``tf-keras``), and TensorFlow reads ``TF_USE_LEGACY_KERAS`` only once, on its first import;
* quiets TensorFlow's C++ start-up lines (oneDNN notices, CUDA probes and a "failed call to
  cuInit" that reads like a failure on every CPU machine), also the ones printed below Python's
  logging while TensorFlow is first imported, whichever module imports it
  (``console.quiet_tensorflow_import``); a command's ``-v`` shows them;
* picks Arrow's allocator: the system's, unless ARROW_DEFAULT_MEMORY_POOL says otherwise. Arrow's
  default (mimalloc) keeps freed blocks: the Beam job on the MIMIC-III demo peaked at 360-376 MiB
  with it and 292-295 MiB with the system allocator, in the same time (bench/data_jobs/job_footprint.py);
  Arrow reads the variable once, when pyarrow is first imported;
* holds the project's one version (pyproject.toml reads it from here).

Its modules: ``cli_args`` (command-line misuse in one line, logging set-up), ``yaml_config``
(configs read into pydantic models) and ``console`` (what reaches the terminal). Cheap to import:
no TensorFlow, no Beam, no numpy.
"""
import os as _os

from ehr_base import console as _console

_console.pin_keras()
_console.quiet_native_logs()
_console.quiet_tensorflow_import()
_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

# The package's one version: CHANGELOG.md has a section for it.
__version__ = "0.1.0"
