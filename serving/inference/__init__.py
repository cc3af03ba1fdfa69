"""The prediction: a validated request -> the model's samples -> the answer's numbers, without HTTP.

``prediction`` is the use case every predict route calls (``predict_admissions``): it checks the
admission type (``admission_type``, which also averages an unknown one), encodes each request with
the training data's own hop (``encoding``), hands the records to the micro-batcher (``batching``),
whose forward passes run the loaded export (``served_model``, the one caller of
``model.export.predict``), and summarises the samples. ``precision`` is the float32 / bfloat16
choice the served model makes at warm-up. Nothing here imports ``serving.api``.
"""
