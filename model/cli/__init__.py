"""The model's command lines, one module per command: ``ehr_train`` (``ehr-train``),
``ehr_eval`` (``ehr-eval``) and ``ehr_analyze`` (``ehr-analyze``).

They parse and check arguments, then hand over to ``model.training``, ``model.evaluation``
and ``model.export`` (or to ``model.image.cli`` for image configs). Each imports TensorFlow
only once the arguments are valid, so ``--help`` and usage errors answer at once.
"""
