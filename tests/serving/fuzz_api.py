"""`make fuzz`: schemathesis with all checks against a real ehr-serve on 127.0.0.1.

The server runs a small fixture export (not a clinical model) in this process; schemathesis
drives it over HTTP from the published OpenAPI schema, positive and negative cases, and fails
on any 5xx, any answer the schema does not document, or any request outside the schema that is
accepted. Exit code: schemathesis's (0 = no failure).
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from serving.api.app import create_app
from serving.inference.served_model import ServedModel
from serving.settings import make_settings
from tests.support.serving_fixtures import ThreadedServer, write_fixture_export

KEY = "fuzz-key-0123456789abcdef"
CONFIG = pathlib.Path(__file__).with_name("schemathesis.toml")


def main(argv: list[str] | None = None) -> int:
    """Starts the service and runs schemathesis against it; returns schemathesis's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=50, help="examples per operation and phase")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (same seed, same cases)")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ehr-fuzz-") as tmp:
        export = write_fixture_export(tmp, ensemble_size=2)
        # No failure budget: the auth checks send hundreds of keyless calls from this one address, and a
        # budget would answer the keyed calls after them 429.
        settings = make_settings(api_keys=[KEY], model_dir=export, warmup=False, auth_failures=0)
        with ThreadedServer(create_app(settings, ServedModel.load(export))) as server:
            return subprocess.run([
                sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run",
                f"{server.base_url}/openapi.json", "--checks", "all", "--header", f"X-API-Key: {KEY}",
                "--max-examples", str(args.max_examples), "--seed", str(args.seed),
                # 25 samples x 2 members on a busy 2-core machine can take seconds: slowness is
                # not what this run looks for.
                "--request-timeout", str(args.request_timeout),
            ]).returncode


if __name__ == "__main__":
    sys.exit(main())
