"""The fitting machinery both trainers share (the EHR model's ``model.ehr`` and ``model.image``).

``training_loop`` (the step, fast-weight optimizers, checkpoints, resume), ``losses`` (NLL, the
KL of the weight posteriors, its annealing), ``devices`` (one device or a mirrored strategy) and
``experiment`` (``ExperimentBase``, what the loop needs of a run's config). It builds on
``model.layers`` only: the two trainers sit beside each other above it and import neither the
other nor anything above them.

Importing this package is cheap (no TensorFlow); ``experiment`` is too.
"""
