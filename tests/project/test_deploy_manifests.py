"""The deployment manifests in docs/deploy/ run what they say: ehr-serve flags, the service's own probes."""
from __future__ import annotations

import yaml

from serving.cli import build_parser
from serving.oip.routes import oip_routers
from serving.settings import API_KEYS_ENV
from tests.support.paths import REPO_ROOT

KSERVE = REPO_ROOT / "docs" / "deploy" / "kserve-inferenceservice.yaml"


def test_the_kserve_inference_service_runs_ehr_serve_on_its_model_repository_with_its_own_probes():
    doc = yaml.safe_load(KSERVE.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    (container,) = doc["spec"]["predictor"]["containers"]
    # KServe recognises the predictor's serving container by this name.
    assert container["name"] == "kserve-container"
    args = build_parser().parse_args(container["args"])  # exits (SystemExit) on a flag ehr-serve lacks
    assert args.model_repository == "/mnt/models" and args.host == "0.0.0.0"
    (port,) = container["ports"]
    assert port["containerPort"] == args.port == 8080
    health, _ = oip_routers(lambda: None, lambda: None, lambda: None)
    routes = {route.path for route in health.routes}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in routes
        assert container[probe]["httpGet"]["port"] == args.port
    env = {e["name"]: e for e in container["env"]}
    assert "STORAGE_URI" in env  # the storage initializer fills /mnt/models from it
    # Keys from a Secret, never written into the manifest.
    assert "secretKeyRef" in env[API_KEYS_ENV]["valueFrom"] and "value" not in env[API_KEYS_ENV]
