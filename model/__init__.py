"""Models of ehr-uncertainty: rank-1 Bayesian layers, the EHR LSTM, the trainer.

``ehr_pipeline`` is imported first because it pins ``TF_USE_LEGACY_KERAS=1``, which
TensorFlow reads only on its first import; edward2 and TFP need the Keras 2 API.
"""
import ehr_pipeline  # noqa: F401  (must run before anything imports TensorFlow)
