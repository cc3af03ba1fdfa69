"""The export directory MODEL_DIR/, the contract between training and the prediction service.

``load`` is the contract and its one reader (the layout, the manifest, ``load_export``): the
service imports it, so it stays free of TensorFlow until a SavedModel is actually loaded.
``predict`` is the prediction function the SavedModel is traced from and that ``ehr-eval``
runs on a loaded export; ``write`` saves a trained model (or a deep ensemble of exports) as
that directory.
"""
