"""`make notebook`: run examples/quickstart.ipynb top to bottom on the current code and keep its outputs.

A code host shows the committed file as it is, so the tables and plots a reader should see must be
in it. This runs the notebook at its own sizes from a fresh working folder (training would resume
from an earlier run's checkpoints otherwise), with paths relative to the checkout so no machine
path lands in the file, and writes it back with its outputs. Log output (stderr: TensorFlow's
start-up chatter, progress bars; TensorFlow's INFO lines on stdout) is dropped: it differs per
machine and says nothing to a reader.
tests/project/test_quickstart_notebook.py checks the stored outputs and runs the notebook again in memory.

    python scripts/run_notebook.py            # examples/quickstart.ipynb, working files in out/quickstart
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def build_parser() -> argparse.ArgumentParser:
    """Flags of the script; every default is shown by --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--notebook", default=str(NOTEBOOK.relative_to(ROOT)),
                   help="notebook to run and rewrite, relative to the checkout")
    p.add_argument("--work", default="out/quickstart",
                   help="the notebook's working folder (QUICKSTART_DIR), relative to the checkout; emptied first")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="longest one cell may run, seconds")
    return p


LOG_LINE_PREFIXES = ("INFO:tensorflow:",)  # TensorFlow's logger writes these to stdout in a kernel


def drop_logs(nb) -> int:
    """Removes stderr outputs and TensorFlow's log lines from every code cell; returns how many outputs went."""
    removed = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.outputs:
            if output.output_type == "stream":
                if output.get("name") == "stderr":
                    continue
                output.text = "".join(line for line in output.text.splitlines(keepends=True)
                                      if not line.startswith(LOG_LINE_PREFIXES))
                if not output.text:
                    continue
            kept.append(output)
        removed += len(cell.outputs) - len(kept)
        cell.outputs = kept
    return removed


def main(argv: list[str] | None = None) -> int:
    """Runs the notebook in the checkout and writes it back with its outputs; returns the exit code."""
    import nbformat
    from nbclient import NotebookClient

    args = build_parser().parse_args(argv)
    path = ROOT / args.notebook
    work = ROOT / args.work
    shutil.rmtree(work, ignore_errors=True)
    # The kernel inherits this environment; relative paths print as such in the outputs.
    os.environ.update(QUICKSTART_DIR=args.work, QUICKSTART_REPO=".")
    for name in ("PATIENTS", "STEPS", "SAMPLES", "BOOTSTRAP"):  # the notebook's own sizes, not a test's
        os.environ.pop(f"QUICKSTART_{name}", None)
    os.environ.pop("EHR_API_KEYS", None)
    nb = nbformat.read(path, as_version=4)
    started = time.time()
    print(f"running {args.notebook} in {args.work} (several minutes on 2 cores) ...", flush=True)
    NotebookClient(nb, timeout=args.timeout_s, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    dropped = drop_logs(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    print(f"wrote {args.notebook} with its outputs in {time.time() - started:.0f} s "
          f"({dropped} stderr log output(s) dropped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
