"""The EHR model, as ``model.image`` is the image model: its experiment config, inputs, network and trainer.

``config`` (the YAML experiment), ``inputs`` (DATA_DIR -> tensors, the Featurizer the export
carries too), ``ehr_model`` (the network built from ``model.layers``) with its fitted linear part
(``wide``, on the scikit-learn ``baselines``' logistic regression), ``mixed_precision``, and
``train``, which runs ``model.fit``'s shared loop and ends a run with its evaluation and export.
The name says which model, not which activity: fitting itself is ``model.fit``, shared with
``model.image``.

Importing this package is cheap (no TensorFlow); ``config`` is too.
"""
