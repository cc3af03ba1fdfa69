"""``ehr-serve``: verify and load a model export, then serve it with uvicorn.

The model is loaded BEFORE the server binds its port, so a missing, corrupt or tampered
export stops the process with exit code 2 and one clear line, instead of a server that
answers 500s; with --model-repository, a version that does not load is skipped with one line
and only a repository where none loads stops it. API keys come from $EHR_API_KEYS
(comma-separated) and/or --api-keys-file; running without keys takes an explicit --no-auth
and a loopback --host.

Every setting flag is made from its ``serving.settings.Settings`` field (type, choices, default,
and the description as help), so a setting is written once.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from typing import Any, Literal, get_args, get_origin

from ehr_base import console
from ehr_base.cli_args import DefaultsOnceFormatter, OneLineParser
from serving.monitoring import malloc
from serving.settings import API_KEYS_ENV, Settings, SettingsError, load_api_keys, make_settings

logger = logging.getLogger("serving")

EXIT_USAGE = 2


# Flags whose name is not the field's (the rest are --field-name; a bool that defaults to on is
# --no-field-name): these names are older than the Settings model and scripts use them.
_FLAG_NAMES = {"model_dir": "--model", "default_num_samples": "--num-samples"}
_METAVARS = {"model_dir": "DIR", "model_repository": "REPO", "default_version": "VERSION",
             "traffic_split": "V=PERCENT,..."}
# Not flags themselves: the keys come from $EHR_API_KEYS and --api-keys-file.
_NOT_FLAGS = {"api_keys"}


@dataclasses.dataclass(frozen=True)
class SettingFlag:
    """One Settings field as an ehr-serve flag."""

    field: str
    flag: str
    dest: str
    inverted: bool  # --no-X: the setting is the flag's opposite

    def value(self, args: argparse.Namespace) -> Any:
        """The setting's value from parsed flags."""
        value = getattr(args, self.dest)
        return not value if self.inverted else value


def setting_flags() -> list[SettingFlag]:
    """Every Settings field that is a flag, in the model's order."""
    flags = []
    for name, field in Settings.model_fields.items():
        if name in _NOT_FLAGS:
            continue
        inverted = field.annotation is bool and field.default is True
        flag = _FLAG_NAMES.get(name) or ("--no-" if inverted else "--") + name.replace("_", "-")
        flags.append(SettingFlag(name, flag, flag[2:].replace("-", "_"), inverted))
    return flags


def _add_setting(parser: argparse.ArgumentParser, setting: SettingFlag) -> None:
    """The flag of one Settings field: its type, choices and default from the field, its help from the description."""
    field = Settings.model_fields[setting.field]
    # argparse expands %-formats in help; a description is plain text.
    kwargs: dict[str, Any] = {"dest": setting.dest, "help": (field.description or "").rstrip(".").replace("%", "%%")}
    if field.annotation is bool:
        kwargs.update(action="store_true", default=False)
    elif field.is_required():
        kwargs.update(required=True, metavar=_METAVARS.get(setting.field))
    elif get_origin(field.annotation) is Literal:
        kwargs.update(default=field.default, choices=list(get_args(field.annotation)))
    else:
        kwargs.update(default=field.default, metavar=_METAVARS.get(setting.field, setting.dest.upper()))
        if field.annotation in (int, float):
            kwargs["type"] = field.annotation
    parser.add_argument(setting.flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The ehr-serve argument parser: one flag per Settings field, each help showing its default."""
    p = OneLineParser(
        prog="ehr-serve",
        description="Serve an exported rank-1 Bayesian LSTM over HTTP (FastAPI + uvicorn). "
                    f"API keys: ${API_KEYS_ENV} (comma-separated) and/or --api-keys-file.",
        formatter_class=DefaultsOnceFormatter,
    )
    for setting in setting_flags():
        _add_setting(p, setting)
        if setting.field == "port":  # where the keys were always listed in --help
            p.add_argument("--api-keys-file", metavar="FILE", default=None,
                           help=f"File with one API key per line ('#' comments allowed), added to ${API_KEYS_ENV}")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="Log level of the service and uvicorn")
    return p


def settings_from_args(args: argparse.Namespace, env=None) -> Settings:
    """Settings from parsed flags and the environment; raises SettingsError on conflicts."""
    keys = [] if args.no_auth else load_api_keys(env, args.api_keys_file)
    return make_settings(api_keys=keys, **{s.field: s.value(args) for s in setting_flags()})


def set_tf_threads(inter_op_threads: int) -> None:
    """Sets TensorFlow's inter-op thread count (0 keeps its default); call before any TensorFlow op runs."""
    if inter_op_threads:  # TensorFlow refuses any change once its runtime has started, even to its default
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)


def server_limits(settings: Settings) -> dict:
    """uvicorn.Config arguments that keep slow or many clients from holding the server."""
    # limit_concurrency answers 503 beyond it instead of accepting sockets until file
    # descriptors run out; the shutdown timeout bounds how long one slow client delays SIGTERM.
    return {"limit_concurrency": settings.max_connections,
            "timeout_graceful_shutdown": settings.shutdown_timeout_s}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ehr-serve`; returns the exit code (2 on bad settings or a bad model directory)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(args)
    except SettingsError as err:
        print(f"ehr-serve: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if settings.no_auth:
        logger.warning("serving WITHOUT authentication on %s (loopback only)", settings.host)

    # Before TensorFlow starts its thread pools: an arena cap applies to arenas made after it.
    malloc.cap_arenas(settings.malloc_arenas)
    # why: after the cheap checks, loading imports TensorFlow
    from serving.inference.model_versions import load_versions
    from serving.inference.served_model import ModelDirError

    # TensorFlow's C++ start-up lines (CUDA probes on a CPU machine) only at --log-level debug.
    with console.native_stderr_muted(verbose=args.log_level == "debug"):
        set_tf_threads(settings.inter_op_threads)
        import tensorflow as tf

        tf.config.list_physical_devices()
    try:
        versions = load_versions(settings)
    except ModelDirError as err:
        what = "model directory" if settings.model_dir is not None else "model repository"
        print(f"ehr-serve: error: bad {what}: {err}", file=sys.stderr)
        return EXIT_USAGE

    import uvicorn

    from serving.api.app import create_app  # why: FastAPI and the app load only once the model has

    app = create_app(settings, versions=versions)
    # access_log=False: our middleware logs each request without its path or query.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level,
                            access_log=False, server_header=False, lifespan="on", **server_limits(settings))
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
