"""Image-classification variants of the rank-1 models (paper Sections 4.2-4.3: WRN-28-10 on CIFAR).

The same layer factory (``model.layers.factory``) and posterior (``model.layers.posterior``) as the EHR LSTM
build every conv and dense layer here; only the architectures, the data and the corrupted
evaluation are image-specific.

  config       typed YAML configs (``task: image``), unknown keys are errors
  data         digits (bundled with scikit-learn), CIFAR-10/100 python pickles, tf.data with augmentation
  corruptions  CIFAR-10-C style corruptions in numpy, and a reader for the real CIFAR-10-C files
  models       rank-1 Wide ResNet and ResNet-18-style networks, shared or per-member batch norm
  train        the training loop (tiled batch, per-component NLL + KL / N + L2), checkpoints, resume
  evaluate     S samples x K members in one pass; NLL / accuracy / ECE clean and per corruption
  cli          ``train_main`` / ``eval_main``, dispatched to from ``ehr-train`` / ``ehr-eval``
"""
import ehr_base  # noqa: F401  (pins TF_USE_LEGACY_KERAS before anything imports TensorFlow)
