"""The bottom of the house: what every layer shares, and nothing else.

``ehr_pipeline`` (data) <- ``model`` <- ``serving`` all stand on this package, so importing it is
the one place that:

* pins the Keras flavour: edward2 and TensorFlow Probability speak the Keras 2 API
  (``tf-keras``), and TensorFlow reads ``TF_USE_LEGACY_KERAS`` only once, on its first import;
* quiets TensorFlow's C++ start-up lines (oneDNN notices, CUDA probes and a "failed call to
  cuInit" that reads like a failure on every CPU machine): ``console.quiet`` decides, and a
  command's ``-v`` shows them;
* holds the project's one version (pyproject.toml reads it from here).

Its modules: ``cli_args`` (command-line misuse in one line, logging set-up), ``yaml_config``
(configs read into pydantic models) and ``console`` (what reaches the terminal). Cheap to import:
no TensorFlow, no Beam, no numpy.
"""
from ehr_base import console as _console

_console.pin_keras()
_console.quiet_native_logs()

# The package's one version: CHANGELOG.md has a section for it.
__version__ = "0.1.0"
