"""Start-up of the service: settings and auth rules, bad model directories, and the ehr-serve CLI as a process."""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib
import shutil
import subprocess
import sys

import httpx
import pytest

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from serving import cli
from serving.monitoring import telemetry as metrics_module
from serving.api.auth import key_matches
from serving.api.app import create_app
from serving.inference.served_model import ModelDirError, ServedModel
from serving.settings import SettingsError, is_loopback, load_api_keys, make_settings
from serving.tools.server_process import ServerProcess
from tests.support.serving_fixtures import ThreadedServer, write_fixture_export, write_manifest
from tests.support.paths import REPO_ROOT

REPO = REPO_ROOT
KEY = "startup-key-0123456789abcdef"


@pytest.fixture(scope="module")
def export_dir(fixture_export):
    return fixture_export


@pytest.fixture
def broken(export_dir, tmp_path):
    """A fresh copy of the valid export to break."""
    return pathlib.Path(shutil.copytree(export_dir, tmp_path / "export"))


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={"PATH": "/usr/bin:/bin", **(env or {})})


# ------------------------------------------------------------------------------- settings and auth


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                            ("::", False), ("10.0.0.5", False), ("example.org", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_no_auth_only_on_loopback_and_keys_otherwise_required(tmp_path):
    with pytest.raises(SettingsError, match="--no-auth is only allowed on a loopback host"):
        make_settings(model_dir=tmp_path, host="0.0.0.0", no_auth=True)
    with pytest.raises(SettingsError, match="no API keys"):
        make_settings(model_dir=tmp_path, host="127.0.0.1")
    with pytest.raises(SettingsError, match="at least 16 characters"):
        make_settings(api_keys=["short"], model_dir=tmp_path)
    s = make_settings(api_keys=[KEY], model_dir=tmp_path, host="0.0.0.0")
    assert KEY not in repr(s) and KEY not in str(s.model_dump())  # SecretStr: never printed


def test_api_keys_from_env_and_file(tmp_path):
    f = tmp_path / "keys.txt"
    f.write_text("# ops team\nfile-key-aaaaaaaaaaaaaaaa\n\n  second-file-key-bbbbbbbbbb  \n")
    env = {"EHR_API_KEYS": " env-key-cccccccccccccccc , ,file-key-aaaaaaaaaaaaaaaa"}
    assert load_api_keys(env, f) == ["env-key-cccccccccccccccc", "file-key-aaaaaaaaaaaaaaaa",
                                     "second-file-key-bbbbbbbbbb"]
    with pytest.raises(SettingsError, match="cannot read API keys file"):
        load_api_keys({}, tmp_path / "missing.txt")


def test_key_matches_is_exact():
    keys = ("a" * 20, "b" * 20)
    assert key_matches("b" * 20, keys) and not key_matches("b" * 19, keys) and not key_matches("", keys)
    assert not key_matches("\udcff" * 20, keys)  # undecodable header bytes do not crash the check


def test_cli_refuses_no_auth_on_public_host_and_missing_keys(export_dir):
    r = run_cli("--model", str(export_dir), "--host", "0.0.0.0", "--no-auth")
    assert r.returncode == 2 and "loopback" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("--model", str(export_dir))
    assert r.returncode == 2 and "EHR_API_KEYS" in r.stderr


def test_cli_help_explains_every_flag_with_default():
    r = run_cli("--help")
    assert r.returncode == 0
    for flag in ("--model", "--host", "--port", "--api-keys-file", "--no-auth", "--max-batch", "--max-wait-ms",
                 "--max-body-bytes", "--max-events", "--max-patients", "--num-samples", "--max-num-samples",
                 "--inter-op-threads"):
        assert flag in r.stdout
    assert "(default: 127.0.0.1)" in r.stdout and "(default: 8000)" in r.stdout and "(default: 5.0)" in r.stdout


# ------------------------------------------------------------------------------- bad model directories


def _rewrite(path: pathlib.Path, text: str) -> None:
    """Changes a file AND re-signs the manifest, so the content check (not the checksum) must catch it."""
    path.write_text(text)
    write_manifest(path.parent if path.parent.name != "saved_model" else path.parent.parent)


@pytest.mark.parametrize("breakage, message", [
    (lambda d: shutil.rmtree(d), "does not exist"),
    (lambda d: (d / "manifest.json").unlink(), "missing manifest.json"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json: not valid JSON"),
    (lambda d: (d / "vocabulary.json").write_text('{"sources": {}}'), "vocabulary.json does not match its checksum"),
    (lambda d: (d / "saved_model" / "variables" / "variables.index").write_bytes(b"x"),
     "variables.index does not match its checksum"),
    (lambda d: (d / "metrics.json").unlink(), "metrics.json is missing"),
    (lambda d: (d / "stray.bin").write_bytes(b"?"), "files not in manifest.json"),
    (lambda d: _rewrite(d / "metrics.json", json.dumps({"test": {"ece": 0.1}})), "metrics.json: referral"),
    (lambda d: _rewrite(d / "model_card.json", json.dumps({"name": "m", "version": "1", "method": "x",
                                                           "ensemble_size": 0})), "ensemble_size"),
    (lambda d: _rewrite(d / "pipeline_config.json", json.dumps({"bagging": {"max_bags": "many"}})),
     "pipeline_config.json"),
    (lambda d: _rewrite(d / "metrics.json", json.dumps({"test": {}, "referral": {
        "measure": "vibes", "rate": 0.1, "threshold": 0.5}})), "metrics.json: referral.measure"),
    (lambda d: _rewrite(d / "vocabulary.json", json.dumps({"sources": {"lab": [1, 2]}})), "vocabulary.json"),
    (lambda d: _rewrite(d / "saved_model" / "saved_model.pb", "not a protobuf"), "cannot load the export"),
])
def test_bad_model_dir_fails_at_load_with_a_message_naming_the_file(broken, breakage, message):
    breakage(broken)
    with pytest.raises(ModelDirError, match=message.replace(".", r"\.")):
        ServedModel.load(broken)


def test_cli_exits_2_on_checksum_mismatch_before_serving(broken, capsys, monkeypatch):
    monkeypatch.setenv("EHR_API_KEYS", KEY)
    (broken / "numeric_stats.json").write_text('{"tampered": true}')
    # In-process main(): the same code path as the console script, without a second TensorFlow start.
    assert cli.main(["--model", str(broken), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "bad model directory" in err and "numeric_stats.json does not match its checksum" in err


# ------------------------------------------------------------------------------- the real process


def test_cli_serves_with_keys_and_logs_no_patient_data(export_dir, tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("file-key-0123456789abcdef\n")
    secrets = {"id": "PATIENT-ID-4711", "code": "SECRET-CODE-42", "type": "SECRET-ADMISSION-TYPE"}
    request = {
        "id": secrets["id"],
        "patient": {"gender": "M", "date_of_birth": "2071-02-03"},
        "admission": {"admit_time": "2150-06-07T05:04:03", "admission_type": secrets["type"]},
        "events": [{"time": "2150-06-07T06:00:00", "source": "lab", "code": secrets["code"], "value": 98.7}],
    }
    server = ServerProcess(["--model", str(export_dir), "--api-keys-file", str(keys_file), "--max-wait-ms", "1"],
                           env={"EHR_API_KEYS": KEY}, log_path=tmp_path / "server.log", cwd=REPO)
    with server:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            for key in (KEY, "file-key-0123456789abcdef"):
                r = c.post("/v1/predict", json=request, headers={"X-API-Key": key})
                assert r.status_code == 200, r.text
                assert r.json()["out_of_vocabulary"]["codes"] == [f"lab:{secrets['code']}"]
            assert c.post("/v1/predict", json=request).status_code == 401
            bad = {**request, "prediction_time": "2150-01-01T00:00:00"}
            assert c.post("/v1/predict", json=bad, headers={"X-API-Key": KEY}).status_code == 422
            rid = c.get("/healthz", headers={"X-Request-ID": "record-4711"}).headers["x-request-id"]
            assert len(rid) == 32 and rid != "record-4711"  # the server's own id, never the client's
            assert c.get("/metrics").status_code == 401  # it shows request outcomes: key required
            metrics = c.get("/metrics", headers={"X-API-Key": KEY}).text
            info = [line for line in metrics.splitlines() if line.startswith("ehr_model_info{")]
            assert len(info) == 1 and 'name="TEST-FIXTURE-not-a-clinical-model"' in info[0], info
    log = server.log()
    # SIGTERM: uvicorn drains, runs the lifespan shutdown, then re-raises the signal (exit -15).
    assert server.proc.returncode in (0, -15) and "Application shutdown complete" in log
    # --precision auto by default; this fixture export predates the bfloat16 signature.
    assert "precision: serving float32 (--precision auto): the export has no bfloat16 signature" in log
    client_hash = hashlib.sha256(b"record-4711").hexdigest()[:16]
    assert "POST /v1/predict status=200" in log and f"request_id={rid} client_request_id_sha256={client_hash}" in log
    for leaked in [*secrets.values(), "2150-06-07", "2071-02-03", "98.7", KEY, "file-key-0123456789abcdef",
                   "record-4711"]:
        assert leaked not in log, f"{leaked!r} reached the log"


def test_a_failing_model_is_a_500_with_request_id_and_a_log_line_without_data(tmp_path, caplog):
    broken = write_fixture_export(tmp_path / "broken", output_scale=3.0)  # probabilities up to 3
    settings = make_settings(model_dir=broken, no_auth=True, warmup=False)
    request = {"patient": {"gender": "F", "age_years": 70.0},
               "admission": {"admit_time": "2150-01-01T00:00:00", "admission_type": "SECRET-TYPE-99"},
               "events": [{"time": "2150-01-01T01:00:00", "source": "lab", "code": "SECRET-CODE-77", "value": 5}]}
    with caplog.at_level(logging.INFO), ThreadedServer(create_app(settings, ServedModel.load(broken))) as srv:
        r = httpx.post(f"{srv.base_url}/v1/predict", json=request, timeout=30)
        assert r.status_code == 500 and r.json()["request_id"] == r.headers["x-request-id"]
        assert "SECRET" not in r.text
        assert httpx.get(f"{srv.base_url}/healthz", timeout=30).status_code == 200  # still serving
        metrics = httpx.get(f"{srv.base_url}/metrics", timeout=30).text
    assert "ehr_model_errors_total 1.0\n" in metrics
    assert 'ehr_http_errors_total{kind="server",route="/v1/predict"} 1.0\n' in metrics
    logged = caplog.text
    assert f"request_id={r.json()['request_id']} unhandled RuntimeError" in logged
    assert "SECRET" not in logged and "outside [0, 1]" not in logged


# ------------------------------------------------------------------------------- metrics text format


def test_prometheus_rendering_escapes_and_accumulates():
    m = metrics_module.ServiceMetrics(namespace="t")
    m.requests.labels(route='/a"b\\c\nd', method="GET", status="200").inc()
    observed = [3, 1, 5000, 4, 0.5]
    for value in observed:
        m.batch_size.observe(value)
    body, content_type = m.render()
    text = body.decode()
    assert content_type.startswith("text/plain") and text.endswith("\n")
    assert 't_http_requests_total{method="GET",route="/a\\"b\\\\c\\nd",status="200"} 1.0' in text
    for bound in metrics_module.BATCH_SIZE_BUCKETS:  # cumulative: le is inclusive
        want = sum(v <= bound for v in observed)
        assert f't_model_batch_size_bucket{{le="{float(bound)}"}} {float(want)}\n' in text
    assert f't_model_batch_size_bucket{{le="+Inf"}} {float(len(observed))}' in text
    assert f"t_model_batch_size_sum {float(sum(observed))}" in text
    with pytest.raises(ValueError):
        m.requests.labels(route="x")  # every label is required


def test_every_app_counts_in_its_own_registry():
    # Same metric names twice in one process: a shared (global) registry would refuse the second.
    first, second = metrics_module.ServiceMetrics(), metrics_module.ServiceMetrics()
    first.predictions.inc(3)
    first.model_info.labels(name="a", version="1", checksum="c").set(1)
    a, b = first.render()[0].decode(), second.render()[0].decode()
    assert "ehr_predictions_total 3.0\n" in a and "ehr_predictions_total 0.0\n" in b
    assert 'ehr_model_info{checksum="c",name="a",version="1"} 1.0' in a
    assert "ehr_model_info{" not in b
    body, content_type = first.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.decode().endswith("# EOF\n")
