"""Evaluation: every number, table, figure and report made of a model's predictions.

Two rooms and the modules that use them. ``statistics`` holds the numbers, pure numpy (``metrics``
and the modules beside it: small-sample rules, calibration, analysis against a known truth,
multi-class metrics, ``clinical_stats``, the metrics.json report), so the trainer, ``ehr-eval``,
the benchmarks and the service report the same thing by the same code. ``report`` holds the page
(text tables, plots, report.html), which reads only numbers the statistics computed.
``evaluate`` gathers predictions of an export or a baseline into the report files;
``against_reference`` compares new data with a model's training population; ``unit_check`` puts a
data folder in the model's units and ``dataset_identity`` names it; ``run_evaluation`` runs
``ehr-eval`` and ``ehr-analyze shift``; ``posterior_rank`` analyses the low-rank structure of a
trained posterior.

Importing this package is cheap (no TensorFlow).
"""
