"""Evaluation: every number, table, figure and report made of a model's predictions.

The numbers are pure numpy (``metrics`` and the modules beside it: analysis against a known
truth, multi-class metrics, the metrics.json report, text tables, ``clinical_stats``), so the
trainer, ``ehr-eval``, the benchmarks and the service report the same thing by the same code.
``evaluate`` gathers predictions of an export or a baseline into the report files (``plots``,
``report_html``); ``against_reference`` compares new data with a model's training population, and
``posterior_rank`` analyses the low-rank structure of a trained posterior.

Importing this package is cheap (no TensorFlow).
"""
