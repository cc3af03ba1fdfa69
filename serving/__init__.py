"""The prediction service of ehr-uncertainty: FastAPI over an exported rank-1 Bayesian LSTM.

``ehr_base`` is imported first because it pins ``TF_USE_LEGACY_KERAS=1``, which
TensorFlow reads only on its first import; the SavedModel's custom layers speak Keras 2.
The service sits on top of the stack: it may import ``model`` and ``ehr_pipeline``, never
the other way round. Build an app with :func:`serving.api.app.create_app`; run one with
``ehr-serve`` (:mod:`serving.cli`).
"""
import ehr_base  # noqa: F401  (must run before anything imports TensorFlow)

__all__ = ["__version__"]
__version__ = ehr_base.__version__
