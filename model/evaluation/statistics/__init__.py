"""The statistics of an evaluation: every number the reports show, as pure functions of predictions.

``metrics`` is the floor (likelihoods, ranking, calibration, uncertainty, bootstrap intervals,
referral: what the trainer, the benchmarks and the service also read); beside it ``small_sample``
(what a small evaluation can say), ``logistic_calibration``, ``against_truth`` (a known true
probability), ``curves`` (the ROC curve and risk histogram the page draws), ``multiclass`` (the
image models); above them ``clinical_stats`` (what a clinical reviewer reads), ``metrics_report``
(metrics.json's numbers, and the performance a model expects before outcomes arrive), ``referral_choice`` (the referral measure chosen on validation) and
``paired_clinical`` (two models on the same cases).

Nothing here draws, formats or writes a file: the page (``model.evaluation.report``) reads these
numbers and never the other way round. This file imports none of the modules.
"""
