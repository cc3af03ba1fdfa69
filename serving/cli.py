"""``ehr-serve``: verify and load a model export, then serve it with uvicorn.

The model is loaded BEFORE the server binds its port, so a missing, corrupt or tampered
export stops the process with exit code 2 and one clear line, instead of a server that
answers 500s. API keys come from $EHR_API_KEYS (comma-separated) and/or --api-keys-file;
running without keys takes an explicit --no-auth and a loopback --host.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ehr_base import console
from ehr_base.cli_args import OneLineParser
from serving.settings import API_KEYS_ENV, Settings, SettingsError, load_api_keys, make_settings

logger = logging.getLogger("serving")

EXIT_USAGE = 2


def _defaults() -> dict:
    """Defaults of every flag, from the Settings model (one source of truth)."""
    return {name: field.default for name, field in Settings.model_fields.items() if name != "model_dir"}


def build_parser() -> argparse.ArgumentParser:
    """The ehr-serve argument parser; every flag's help shows its default."""
    d = _defaults()
    p = OneLineParser(
        prog="ehr-serve",
        description="Serve an exported rank-1 Bayesian LSTM over HTTP (FastAPI + uvicorn). "
                    f"API keys: ${API_KEYS_ENV} (comma-separated) and/or --api-keys-file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="DIR",
                   help="export directory written by model.export.write (manifest.json, saved_model/, ...)")
    p.add_argument("--host", default=d["host"], help="interface to bind; --no-auth needs a loopback one")
    p.add_argument("--port", type=int, default=d["port"], help="TCP port (0 = any free port)")
    p.add_argument("--api-keys-file", metavar="FILE", default=None,
                   help=f"file with one API key per line ('#' comments allowed), added to ${API_KEYS_ENV}")
    p.add_argument("--no-auth", action="store_true",
                   help="serve WITHOUT API keys; refused unless --host is 127.0.0.1, ::1 or localhost")
    p.add_argument("--max-batch", type=int, default=d["max_batch"],
                   help="most examples merged into one forward pass")
    p.add_argument("--max-wait-ms", type=float, default=d["max_wait_ms"],
                   help="longest a request waits for others to share its forward pass, milliseconds")
    p.add_argument("--max-queue", type=int, default=d["max_queue"],
                   help="requests waiting for the model before new ones are answered 503")
    p.add_argument("--max-body-bytes", type=int, default=d["max_body_bytes"],
                   help="largest request body accepted, bytes (larger: 413)")
    p.add_argument("--max-events", type=int, default=d["max_events"], help="most events per patient (more: 422)")
    p.add_argument("--max-patients", type=int, default=d["max_patients"],
                   help="most patients per batch request (more: 422)")
    p.add_argument("--num-samples", type=int, default=d["default_num_samples"],
                   help="samples per ensemble member when a request does not say")
    p.add_argument("--max-num-samples", type=int, default=d["max_num_samples"],
                   help="largest num_samples a request may ask for")
    p.add_argument("--precision", default=d["precision"], choices=["auto", "float32", "bfloat16"],
                   help="operands of the LSTM's matmuls: float32 is exact (equals ehr-eval for a seed); "
                        "bfloat16 moves probabilities by at most the tolerance in docs/serving.md and is faster "
                        "on some CPUs, slower on others; auto times both at warm-up and serves bfloat16 only "
                        "where its pass takes at most 90%% of float32's here and stays within that tolerance "
                        "(/v1/model and the start-up log say which and why)")
    p.add_argument("--inter-op-threads", type=int, default=d["inter_op_threads"],
                   help="TensorFlow inter-op threads (0: TensorFlow's default, one per core); matmuls still use "
                        "every core (intra-op). 1 avoids a thread hand-off per op of the LSTM loop (docs/serving.md)")
    p.add_argument("--monitor-window", type=int, default=d["monitor_window"],
                   help="recent admissions the population monitor compares with the model's training population "
                        "(GET /v1/monitor, ehr_shift_* gauges; docs/shift.md); 0 turns it off")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the start-up forward pass (/readyz is 'ok' at once)")
    p.add_argument("--open-metrics", action="store_true",
                   help="serve /metrics without an API key (default: the key is required there too)")
    p.add_argument("--body-timeout-s", type=float, default=d["body_timeout_s"],
                   help="longest wait for the next piece of a request body, seconds (slower: 408)")
    p.add_argument("--max-connections", type=int, default=d["max_connections"],
                   help="most connections and requests at once (more: 503 at once)")
    p.add_argument("--shutdown-timeout-s", type=float, default=d["shutdown_timeout_s"],
                   help="after SIGTERM, longest wait for open requests before closing them, seconds")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level of the service and uvicorn")
    return p


def settings_from_args(args: argparse.Namespace, env=None) -> Settings:
    """Settings from parsed flags and the environment; raises SettingsError on conflicts."""
    keys = [] if args.no_auth else load_api_keys(env, args.api_keys_file)
    return make_settings(
        api_keys=keys,
        model_dir=args.model,
        host=args.host,
        port=args.port,
        no_auth=args.no_auth,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        max_events=args.max_events,
        max_patients=args.max_patients,
        default_num_samples=args.num_samples,
        max_num_samples=args.max_num_samples,
        warmup=not args.no_warmup,
        precision=args.precision,
        open_metrics=args.open_metrics,
        body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
        shutdown_timeout_s=args.shutdown_timeout_s,
        inter_op_threads=args.inter_op_threads,
        monitor_window=args.monitor_window,
    )


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

    from serving.predictor import ModelDirError, ServedModel  # after the cheap checks: loading imports TensorFlow

    # TensorFlow's C++ start-up lines (CUDA probes on a CPU machine) only at --log-level debug.
    with console.native_stderr_muted(verbose=args.log_level == "debug"):
        set_tf_threads(settings.inter_op_threads)
        import tensorflow as tf

        tf.config.list_physical_devices()
    try:
        predictor = ServedModel.load(settings.model_dir, settings.precision)
    except ModelDirError as err:
        print(f"ehr-serve: error: bad model directory: {err}", file=sys.stderr)
        return EXIT_USAGE

    import uvicorn

    from serving.app import create_app

    app = create_app(settings, predictor)
    # access_log=False: our middleware logs each request without its path or query.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level,
                            access_log=False, server_header=False, lifespan="on", **server_limits(settings))
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
