"""Helpers the tests share that are not fixtures (fixtures are in tests/conftest.py); never a test module.

- ``paths``: the checkout and the real MIMIC-III demo.
- ``shared_dirs``: a folder built once per session, also under pytest-xdist.
- ``ehr_testdata``: small real pipeline output folders and request bodies for the model and service tests.
- ``job_outputs``: the demo job's config, reading a job's output, the cohort from the raw tables, a worker's site.
- ``arrow_rows``, ``synth_records``, ``hostile_data``, ``hostile_meds``, ``meds_data``: inputs of the data tests.
- ``serving_fixtures``: the seeded-noise fixture export and an in-process uvicorn server.
- ``json_mutation``, ``image_configs``, ``browser``: a JSON fuzz step, the tiny image config, headless Chromium.
- ``multidevice_run``: a script run in its own process by tests/model/fit/test_devices.py.
"""
