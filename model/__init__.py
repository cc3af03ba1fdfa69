"""Models of ehr-uncertainty: rank-1 Bayesian layers, the EHR LSTM, the trainer.

``ehr_base`` is imported first because it pins ``TF_USE_LEGACY_KERAS=1``, which
TensorFlow reads only on its first import; edward2 and TFP need the Keras 2 API.
"""
import ehr_base  # noqa: F401  (must run before anything imports TensorFlow)
