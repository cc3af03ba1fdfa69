"""Training the EHR model: its experiment config, its inputs, the network, and the loop.

``config`` (the YAML experiment), ``inputs`` (DATA_DIR -> tensors, the Featurizer the export
carries too), ``ehr_model`` (the network built from ``model.layers``) with its fitted linear part
(``wide``, on the scikit-learn ``baselines``' logistic regression), and the training itself:
``losses``, ``precision``, ``devices``, the shared ``training_loop`` (also the image trainer's)
and ``train``, which ends a run with its evaluation and export.

Importing this package is cheap (no TensorFlow); ``config`` is too.
"""
