"""Service settings: one frozen pydantic model, built by the CLI (or a test) and handed to create_app.

Nothing here is read from module-level state: the app factory receives a ``Settings`` value
and routes get it through dependency injection, so two apps with different settings can
live in one process (the tests do exactly that).
"""
from __future__ import annotations

import ipaddress
import os
import pathlib
from collections.abc import Iterable, Mapping

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ehr_base.yaml_config import describe_errors
from model.export_layout import MAX_SAMPLES

API_KEYS_ENV = "EHR_API_KEYS"  # comma-separated keys; merged with --api-keys-file
MIN_API_KEY_LENGTH = 16  # shorter keys are guessable by brute force over the network
LOOPBACK_NAMES = ("localhost",)


class SettingsError(ValueError):
    """Settings that cannot work together (e.g. --no-auth on a public interface)."""


def is_loopback(host: str) -> bool:
    """True when `host` names the loopback interface (127.0.0.0/8, ::1 or 'localhost')."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost: we cannot know where it binds
        return False


class Settings(BaseModel):
    """Everything the service needs besides the model itself.

    The one place a setting is written: ``serving.cli`` makes each field an ``ehr-serve`` flag
    with this default and description as its help, in this order.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # One declaration per setting, alike in shape: each becomes a flag with its own help.
    model_dir: pathlib.Path | None = Field(
        None, description="Export directory written by model.export.write (manifest.json, saved_model/, ...), "
                          "served as the one version; give it or --model-repository.")
    model_repository: pathlib.Path | None = Field(
        None, description="Model repository laid out as Triton's, REPO/NAME/VERSION/ with VERSION a positive "
                          "integer, each an export: every version that loads is served side by side, a broken one "
                          "is skipped with one log line (docs/serving.md 'Several versions side by side'); "
                          "instead of --model.")
    default_version: int | None = Field(
        None, ge=1, description="The repository's version that answers /v1, FHIR and /v2/models/NAME without "
                                "--traffic-split; unset, the highest version that loaded.")
    traffic_split: dict[int, int] | None = Field(
        None, description="Share of admissions per repository version, percent, e.g. '1=90,2=10' (summing to "
                          "100): an admission's version is fixed by a hash of the admission (sticky: the same "
                          "admission always reaches the same version); None: every admission gets the default "
                          "version.")
    host: str = Field("127.0.0.1", description="Interface to bind; --no-auth needs a loopback one.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = any free port).")
    api_keys: tuple[SecretStr, ...] = Field(
        (), description="Accepted API keys (SecretStr: never printed in reprs or logs).")
    no_auth: bool = Field(
        False, description="Serve WITHOUT API keys; refused unless --host is 127.0.0.1, ::1 or localhost.")
    max_batch: int = Field(
        32, ge=1, le=1024, description="Most examples merged into one forward pass.")
    max_wait_ms: float = Field(
        5.0, ge=0.0, le=1000.0,
        description="Longest a request waits for others to share its forward pass, milliseconds.")
    max_queue: int = Field(
        1024, ge=1, description="Requests waiting for the model before new ones are answered 503.")
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body accepted, bytes (larger: 413).")
    max_events: int = Field(
        20000, ge=1, description="Most events per patient (more: 422 naming 'events').")
    max_patients: int = Field(
        64, ge=1, description="Most patients per batch request (more: 422 naming 'patients').")
    default_num_samples: int = Field(
        25, ge=1, description="Monte-Carlo samples per ensemble member when a request does not say.")
    max_num_samples: int = Field(
        MAX_SAMPLES, ge=1, le=MAX_SAMPLES, description="Largest num_samples a request may ask for (the export "
        "signature's limit).")
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Operands of the LSTM's matmuls: float32 is exact (equals ehr-eval for a seed); "
                            "bfloat16 moves probabilities by at most the tolerance in docs/serving.md and is faster "
                            "on some CPUs, slower on others; auto times both at warm-up and serves bfloat16 only "
                            "where its pass takes at most 90% of float32's here and stays within that tolerance "
                            "(/v1/model and the start-up log say which and why).")
    inter_op_threads: int = Field(
        0, ge=0, description="TensorFlow inter-op threads (0: TensorFlow's default, one per core); matmuls still "
                             "use every core (intra-op). The model runs one pass at a time and its LSTM loop is a "
                             "chain of small ops: 1 runs them without a thread hand-off per op, which helped on a "
                             "loaded machine and made no difference on a quiet one (docs/serving.md).")
    monitor_window: int = Field(
        500, ge=0, le=100000, description="Recent admissions the population monitor compares with the model's "
                                          "training population (GET /v1/monitor, ehr_shift_* gauges; "
                                          "docs/shift.md); 0 turns it off.")
    malloc_arenas: int = Field(
        2, ge=0, le=1024, description="Most glibc malloc arenas (M_ARENA_MAX; 0: glibc's default, 8 per core). The "
                                      "service's ~36 threads otherwise spread short-lived allocations over many "
                                      "arenas whose freed memory fragments: resident memory grew ~30 MiB/min under "
                                      "load (serving/monitoring/malloc.py, docs/benchmarks.md 'soak').")
    monitor_refresh_s: float = Field(
        10.0, ge=0.0, le=3600.0,
        description="Longest the monitor's report is served before it is made again, seconds, when admissions came "
                    "since; scrapes and /v1/monitor get the last one at once while the next is made (its age: "
                    "ehr_shift_report_age_seconds). 0 makes it again whenever the window changed.")
    warmup: bool = Field(
        True, description="Run the start-up forward passes before /readyz says 'ok'; --no-warmup skips them "
                          "(/readyz is 'ok' at once).")
    auth_failures: int = Field(
        20, ge=0, description="Failed authentications (a missing or wrong API key) one client address may make in "
                              "--auth-window-s; beyond them its requests get 429 with Retry-After, their key "
                              "unchecked, until the oldest failure is that old. 0 turns the limit off.")
    auth_window_s: float = Field(
        60.0, gt=0.0, le=86400.0, description="The window of --auth-failures, seconds.")
    open_metrics: bool = Field(
        False, description="Serve /metrics without an API key (it shows request outcomes, so by default the "
                           "key is required there too).")
    body_timeout_s: float = Field(
        10.0, gt=0.0, le=600.0,
        description="Longest wait for the next piece of a request body, seconds (slower: 408).")
    max_connections: int = Field(
        512, ge=1, description="Most connections and requests at once (more: 503 at once).")
    shutdown_timeout_s: float = Field(
        15.0, gt=0.0, le=600.0, description="After SIGTERM, longest wait for open requests before closing them, "
                                            "seconds; then the server exits.")
    outcome_dir: pathlib.Path | None = Field(
        None, description="Folder of the outcome store (outcomes.sqlite): every answer gets a prediction_id, "
                          "POST /v1/outcomes takes the outcome keyed by it, /v1/monitor and /metrics report realized "
                          "beside expected performance (docs/serving.md 'Outcomes'). None: off, nothing stored.")
    outcome_retention_days: float = Field(
        90.0, gt=0.0, le=3650.0, description="Days a prediction and its outcome are kept in the outcome store; "
                                             "older rows are deleted at start and hourly.")
    outcome_keep_admissions: bool = Field(
        False, description="Also keep each encoded admission (the model's input tensors, no names or free text) "
                           "in the outcome store, as local data for ehr-adapt; off: only probabilities are kept.")

    @field_validator("traffic_split", mode="before")
    @classmethod
    def _parse_split(cls, value: Any) -> Any:
        return parse_traffic_split(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if (self.model_dir is None) == (self.model_repository is None):
            raise ValueError("give exactly one of --model DIR (one export) and --model-repository REPO "
                             "(REPO/NAME/VERSION/ exports)")
        if self.model_repository is None and (self.default_version is not None or self.traffic_split):
            raise ValueError("--default-version and --traffic-split choose among the versions of "
                             "--model-repository; --model serves one")
        if self.traffic_split is not None:
            if len(self.traffic_split) < 2 or any(v < 1 or share < 1 for v, share in self.traffic_split.items()):
                raise ValueError(f"--traffic-split: two or more versions (positive integers), each a share of at "
                                 f"least 1 percent, got {self.traffic_split}")
            if sum(self.traffic_split.values()) != 100:
                raise ValueError(f"--traffic-split: the shares must sum to 100 percent, got "
                                 f"{sum(self.traffic_split.values())}")
        if self.no_auth and not is_loopback(self.host):
            raise ValueError(
                f"--no-auth is only allowed on a loopback host (127.0.0.1, ::1, localhost), got "
                f"--host {self.host}: set API keys with {API_KEYS_ENV} or --api-keys-file instead")
        if not self.no_auth and not self.api_keys:
            raise ValueError(
                f"no API keys: set {API_KEYS_ENV} (comma-separated) or --api-keys-file, or pass "
                f"--no-auth to serve without keys on a loopback host")
        short = [i for i, k in enumerate(self.api_keys) if len(k.get_secret_value()) < MIN_API_KEY_LENGTH]
        if short:  # say which (by position), never what
            raise ValueError(f"API keys must have at least {MIN_API_KEY_LENGTH} characters; "
                             f"key number(s) {[i + 1 for i in short]} are shorter")
        if self.default_num_samples > self.max_num_samples:
            raise ValueError(f"default_num_samples ({self.default_num_samples}) exceeds "
                             f"max_num_samples ({self.max_num_samples})")
        return self


def parse_traffic_split(text: str) -> dict[int, int]:
    """'1=90,2=10' -> {1: 90, 2: 10} (version -> percent), in the order written; ValueError naming the part."""
    split: dict[int, int] = {}
    for part in (p.strip() for p in text.split(",")):
        version, sep, share = part.partition("=")
        if not sep or not version.strip().isdigit() or not share.strip().isdigit():
            raise ValueError(f"--traffic-split: {part[:40]!r} is not VERSION=PERCENT (e.g. '1=90,2=10')")
        if int(version) in split:
            raise ValueError(f"--traffic-split: version {int(version)} named twice")
        split[int(version)] = int(share)
    return split


def parse_api_keys(text: str, *, separator: str | None = None) -> list[str]:
    """Keys from text: split on `separator` (None: lines); blanks and '#' comment lines skipped."""
    parts = text.split(separator) if separator else text.splitlines()
    keys = []
    for part in parts:
        key = part.strip()
        if key and not key.startswith("#"):
            keys.append(key)
    return keys


def load_api_keys(env: Mapping[str, str] | None = None, keys_file: str | os.PathLike | None = None) -> list[str]:
    """API keys from EHR_API_KEYS in `env` (default os.environ) plus one-per-line `keys_file`; deduplicated."""
    env = os.environ if env is None else env
    keys = parse_api_keys(env.get(API_KEYS_ENV, ""), separator=",")
    if keys_file is not None:
        try:
            text = pathlib.Path(keys_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SettingsError(f"cannot read API keys file {keys_file}: {err}") from None
        keys += parse_api_keys(text)
    return list(dict.fromkeys(keys))  # keeps order, drops repeats


def make_settings(api_keys: Iterable[str] = (), **kwargs) -> Settings:
    """Settings from plain values; raises SettingsError with one readable line per problem."""
    import pydantic

    try:
        return Settings(api_keys=tuple(SecretStr(k) for k in api_keys), **kwargs)
    except pydantic.ValidationError as err:
        raise SettingsError(describe_errors(err)) from None
