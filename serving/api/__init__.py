"""The HTTP surface of the service: what comes in, what goes out, and the app that holds them.

A request enters through ``middleware`` (request id, access log, body limits) and ``auth`` (API
keys), reaches a route of ``routes`` (/v1, health, metrics) or ``fhir_routes`` (FHIR, CDS Hooks,
answered by ``fhir_answers``), which takes its piece of the app's state from ``dependencies`` and
calls the prediction use case in ``serving.inference``. ``errors`` turns every failure into a JSON
answer; ``lifespan`` loads the model, starts the micro-batcher and warms up; ``api_docs`` serves
/docs; ``app`` assembles them. No module here imports a route module, and nothing below
``serving.api`` imports it.
"""
