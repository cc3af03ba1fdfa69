"""Updating a trained model at a new site with the site's own outcomes (``ehr-adapt``; docs/model.md).

``run_update.run_update`` is the front door: ``local_data`` reads the site's labelled admissions,
``update`` runs a method (the recalibrations of ``recalibration``, ``closed_test``'s choice with
``revision``, or a weight update of the network ``rebuild`` restores: ``weight_fit``'s loop,
``bayes_update``), and ``export_update`` writes the updated export. ``outcome_alarm`` says whether
outcomes that arrived show the model mis-predicting deaths (O/E with an exact interval), the
service's cue to run an update; ``outcome_file`` is the schema of the service's outcome store and the
reader that takes its kept admissions as local data. ``config`` holds the settings
and is cheap to import (no TensorFlow), so ``ehr-adapt --help`` answers at once; this file imports
none of the modules.
"""
