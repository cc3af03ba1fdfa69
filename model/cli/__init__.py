"""The model's command lines, one module per command: ``ehr_train`` (``ehr-train``),
``ehr_eval`` (``ehr-eval``) and ``ehr_analyze`` (``ehr-analyze``).

They parse and check arguments, then hand over to ``model.ehr``, ``model.evaluation``
and ``model.export`` (or to ``model.image.cli`` for image configs). Each imports TensorFlow
only once the arguments are valid, so ``--help`` and usage errors answer at once: their
function-level imports of the project's own code say so with a ``# why:`` comment, and every
other import sits at the top.

Here too what the commands share: the exit code of a shift report at its ``--fail-on`` level.
"""

# Exit code of a command whose shift report reached its --fail-on level (2 is a usage error).
EXIT_SHIFT = 3
# The levels a --fail-on flag names (model.evaluation.against_reference.ShiftResult.fails).
FAIL_ON = ("severe", "moderate", "never")
