"""The versions of the served model side by side: where they come from, and which one answers an admission.

``load_versions`` loads ``--model DIR`` as the one version, named as its model card names it, or every
``REPO/NAME/VERSION/`` export of ``--model-repository`` (Triton's layout: NAME the model, VERSION a positive
integer). A version that does not load is skipped with one log line naming its folder and why, and kept in
``ModelVersions.failed`` so ``/v2/models/NAME/versions/V/ready`` can say why it is not ready; start-up fails
only when no version loads (as for a broken ``--model``).

``ModelVersions.route`` picks the version for an admission: the traffic split's choice
(``serving.inference.traffic_split``: a fixed hash of the admission's key, so the same admission always
reaches the same version) when there is a split, else the default (``--default-version``, else the highest
version that loaded). A split's version that did not load hands its admissions to the default version.

Each version has its own micro-batcher (the app's lifespan makes them): a forward pass runs one model. The
population monitor is the default version's alone: /v1/monitor and the ehr_shift_* gauges report one window,
and its mutual information is one model's; the admissions the split sends to other versions are a sample of
the same population, so the default's window still watches for shift.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import pathlib
from collections.abc import Mapping

from serving.inference.batching import MicroBatcher
from serving.inference.served_model import ModelDirError, ServedModel
from serving.inference.traffic_split import choose_version
from serving.monitoring.monitor import Monitor
from serving.schemas import PredictRequest
from serving.settings import Settings

logger = logging.getLogger(__name__)

DEFAULT, SPLIT, REQUESTED = "default", "split", "request"  # how a request's version was chosen


@dataclasses.dataclass(eq=False)
class ServedVersion:
    """One loaded version: its model, and the batcher, monitor (the default's only) and readiness the app's lifespan
    gives it."""

    version: str
    predictor: ServedModel
    batcher: MicroBatcher | None = None
    monitor: Monitor | None = None
    ready: bool = False  # warmed up


@dataclasses.dataclass(frozen=True)
class ModelVersions:
    """The served model's versions: the loaded ones (ascending), those that failed and why, the default, the split."""

    name: str
    loaded: dict[str, ServedVersion]
    failed: dict[str, str]
    default: str
    split: Mapping[int, int] | None = None  # version -> percent, in the order the split names them

    def route(self, key: str) -> tuple[ServedVersion, str]:
        """The version for the admission with this key, and how it was chosen (DEFAULT or SPLIT)."""
        if self.split is None:
            return self.loaded[self.default], DEFAULT
        chosen = str(choose_version(key, self.split))
        if chosen not in self.loaded:  # a broken canary: its admissions go to the default version
            return self.loaded[self.default], DEFAULT
        return self.loaded[chosen], SPLIT

    def shares(self) -> dict[str, int]:
        """Loaded version -> percent of admissions it answers (the default takes a failed split version's share)."""
        shares = {v: 0 for v in self.loaded}
        for version, share in (self.split or {self.default: 100}).items():
            shares[str(version) if str(version) in self.loaded else self.default] += share
        return shares


def admission_key(request: PredictRequest) -> str:
    """The key a JSON request's admission is routed by (key_of its patient and admit time)."""
    patient = request.patient
    return key_of(patient.gender, patient.date_of_birth, patient.age_years, request.admission.admit_time)


def key_of(gender: str, date_of_birth: dt.date | None, age_years: float | None, admit_time: dt.datetime) -> str:
    """'<gender>|<date_of_birth, or age=years>|<admit time in UTC, ISO 8601>': an admission's routing key.

    The same admission sent again, with more events or a later prediction time, through /v1, OIP's
    admission_json or FHIR, has one key, so the traffic split sends it to one version.
    """
    if admit_time.tzinfo is None:  # no offset means UTC, as everywhere in a request
        admit_time = admit_time.replace(tzinfo=dt.timezone.utc)
    born = date_of_birth.isoformat() if date_of_birth is not None else f"age={age_years!r}"
    return f"{gender}|{born}|{admit_time.astimezone(dt.timezone.utc).isoformat()}"


def single(predictor: ServedModel) -> ModelVersions:
    """One loaded export as the only (and default) version."""
    return ModelVersions(predictor.name, {predictor.version: ServedVersion(predictor.version, predictor)}, {},
                         predictor.version)


def find_versions(repository: pathlib.Path) -> tuple[str, dict[str, pathlib.Path]]:
    """(model name, version -> folder, ascending) of a repository REPO/NAME/VERSION/; ModelDirError naming it."""
    if not repository.is_dir():
        raise ModelDirError(f"model repository {repository}: not a directory")
    models = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(models) != 1:
        raise ModelDirError(f"model repository {repository}: this server serves one model, found "
                            f"{len(models)} model folders ({', '.join(p.name for p in models[:5])})")
    [model] = models
    entries = sorted(p for p in model.iterdir() if not p.name.startswith("."))
    versions = {p.name: p for p in entries if p.is_dir() and p.name.isdigit() and int(p.name) > 0}
    others = [p.name for p in entries if p.name not in versions]
    if others:
        logger.warning("model repository %s: %d entries that are not version folders (a positive integer) left "
                       "aside: %s", model, len(others), ", ".join(others[:5]))
    if not versions:
        raise ModelDirError(f"model repository {repository}: {model.name}/ holds no version folder (a positive "
                            f"integer, e.g. {model.name}/1/)")
    return model.name, dict(sorted(versions.items(), key=lambda item: int(item[0])))


def load_versions(settings: Settings) -> ModelVersions:
    """The versions to serve (module docstring); ModelDirError when none loads or a named version is not there."""
    if settings.model_dir is not None:
        return single(ServedModel.load(settings.model_dir, settings.precision))
    repository = settings.model_repository
    assert repository is not None  # Settings wants one of the two
    name, folders = find_versions(repository)
    for version in [settings.default_version, *(settings.traffic_split or {})]:
        if version is not None and str(version) not in folders:
            raise ModelDirError(f"model repository {repository}: {name}/ has no version {version} (versions: "
                                f"{', '.join(folders)})")
    loaded, failed = {}, {}
    for version, folder in folders.items():
        try:
            loaded[version] = ServedVersion(version, ServedModel.load(folder, settings.precision, name=name,
                                                                      version=version))
        except (ModelDirError, OSError) as err:  # one line: the folder and why; the others still serve
            # Answers to clients name the version, not the server's folders.
            failed[version] = " ".join(str(err).split()).replace(str(folder), f"{name}/{version}")
            logger.error("model repository: version %s of %s (%s) skipped: %s", version, name, folder,
                         failed[version])
    if not loaded:
        raise ModelDirError(f"model repository {repository}: no version of {name} loads: "
                            + "; ".join(f"{v}: {why}" for v, why in failed.items()))
    default = str(settings.default_version) if settings.default_version is not None else list(loaded)[-1]
    if default not in loaded:
        logger.warning("default version %s of %s did not load; the highest that did, %s, is the default", default,
                       name, list(loaded)[-1])
        default = list(loaded)[-1]
    versions = ModelVersions(name, loaded, failed, default, settings.traffic_split)
    logger.info("model %s: versions %s loaded%s, default %s, shares %s", name, ", ".join(loaded),
                f" ({', '.join(failed)} failed)" if failed else "", default,
                ", ".join(f"{v}={s}%" for v, s in versions.shares().items()))
    return versions
