"""The Open Inference Protocol v2 (KServe v2 REST), the protocol KServe, Triton and MLServer clients speak.

``routes`` builds the /v2 endpoints around the app's dependencies; ``tensors`` turns a request body into
named input tensors and named outputs into a response body (JSON, and the binary-data extension);
``records`` checks serialized SequenceExamples against the export's contract and scores them. JSON
admissions take the service's one prediction road (``serving.inference.prediction``). Nothing here
imports ``serving.api``: the app imports this room.
"""
from serving.oip.routes import model_metadata, oip_routers, protocol_error

__all__ = ["model_metadata", "oip_routers", "protocol_error"]
