"""Every shell command in README.md, docs/*.md and docs/tasks/*.md runs as written, or is listed here as skipped, with why.

A command is a line of a fenced block labelled bash, sh, shell or console (in a console block, a line
starting with "$ "), with backslash continuations and quotes that span lines joined and comments
dropped (tests/support/doc_commands.py). An unlabelled block that starts with one of our programs fails:
label it so it is seen. After a task page's commands ran, every output path its "Where the outputs land"
table names must be there, where a Run command (or a trained run's copy, below) put it.

COMMANDS classifies them: the first entry whose pattern matches a command (re.search on its text,
runs of white space as one space; ``document`` limits an entry to one file) decides. A command no
entry matches fails the quick test below, and so does an entry no command matches, so a command
added to the docs must be put in one of two kinds here:

* ``Run``: run by the slow test, in document order, one fresh working folder per document (two
  documents at a time), with ``bash -c`` and the checkout's environment. It must exit 0 (or one of
  ``exit_codes``) and print ``check``.
* ``Skip``: not run, with the reason; its flags are still checked against the tool's argument
  parser (Beam's options for ``ehr-pipeline run``), and an ``ehr-train`` config with its
  ``--set`` overrides is loaded and validated.

The working folder holds what the documents' relative paths expect, so that commands run as
written:

* ``../shared/mimic-iii-demo``: a link to the real MIMIC-III demo (tests/conftest.py). Without it a
  small synthetic release (same layout) stands in, and the commands marked ``needs_demo`` (one of
  the real demo's admissions by its HADM_ID) are not run: the test then skips, saying so.
* ``configs/``, ``bench/``, ``tests/``, ``setup.py``: links into the checkout.
* ``runs/rank1``, ``out/demo/run`` (the run folder ``make demo`` trains), ``runs/site-a``: copies of the
  session's tiny trained rank-1 run (``trained_rank1``). The training commands that would make them take minutes to hours and are
  skipped; what the documents do with their runs is run.
* ``EHR_API_KEYS``: a fresh 43-character key, as docs/serving.md's first command makes one (a
  document's own ``export`` replaces it).

How they run: one command of each console script (ehr-pipeline, ehr-eval, ehr-analyze), the ``Run``
marked ``process`` (its cheapest), runs as a reader's shell runs it, the installed script in a fresh
process; the rest of that script's commands call its ``main`` with the command's words in this process
(in the document's folder, one at a time, stdout captured), which spares each ~5 s of TensorFlow and
Beam start-up, and the fresh process's first TensorFlow traces (the README's ehr-eval on the demo took
74 s as a process, 16 s in this one, on the loaded 2-core machine). Every other command
(``ehr-serve``, ``curl``, ``export``, a ``python`` script) and any command with shell syntax (``$``, a
glob, a pipe, a redirection, a leading assignment) runs with ``bash -c``, but for ``python -c CODE``,
whose CODE runs in this process too.

What is substituted, and only that: each ``Run`` lists its own substitutions (``subs``, with
``why``); every ``ehr-serve`` listens on 127.0.0.1 at a free port (``--host 0.0.0.0`` and
``--port``, or no port, are replaced: the test machine is shared), and every curl's
``localhost:8000`` / ``127.0.0.1:8000`` goes to the ``ehr-serve`` the document started last, which
runs until the next one starts or the document ends.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib
import io
import os
import pathlib
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.support.doc_commands import Command, document_commands, fenced_blocks
from tests.support.doc_outputs import attributed_outputs
from tests.support.paths import DEMO_DIR, DEMO_MISSING, REPO_ROOT, demo_available

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
             *sorted((REPO_ROOT / "docs" / "tasks").glob("*.md"))]
# An unlabelled fenced block starting with one of these is a command block in disguise.
PROGRAMS = ("ehr-pipeline", "ehr-train", "ehr-eval", "ehr-analyze", "ehr-serve", "python", "make", "curl",
            "docker", "export")
LINKED = ("configs", "bench", "tests", "setup.py")
# Where the documents expect a trained run: `make demo`'s run folder and the runs the skipped ehr-train commands write.
TRAINED_RUNS = ("runs/rank1", "out/demo/run", "runs/site-a")
COMMAND_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Run:
    """A documented command the slow test runs as written (but for `subs`) and whose output shows `check`."""

    pattern: str
    check: str = ""
    subs: tuple[tuple[str, str], ...] = ()  # (text, replacement) in the command, each for `why`
    why: str = ""
    needs_demo: bool = False
    exit_codes: tuple[int, ...] = (0,)
    document: str | None = None  # only in this document (a path relative to the checkout)
    process: bool = False  # the one command of its console script (IN_PROCESS) run in a fresh process


@dataclasses.dataclass(frozen=True)
class Skip:
    """A documented command not run here, and why."""

    pattern: str
    reason: str
    document: str | None = None  # only in this document (a path relative to the checkout)


DEMO = "../shared/mimic-iii-demo"
SYNTHETIC = "../shared/synthetic-release"  # a small `ehr-pipeline synth` release, CHARTEVENTS included
TRAINING = ("trains for minutes (the digits) to hours (Table-7 size); tests/model/ehr/test_train.py and "
            "tests/model/image/test_image_train.py run the trainer at tiny size")
SYNOPSIS = "a synopsis: brackets and capitals mark optional flags and placeholders"

# First match wins: specific patterns before general ones, grouped by program. A new documented command
# goes in its group: a Run if it takes seconds here (say what its output must show), else a Skip saying why.
COMMANDS: list[Run | Skip] = [
    # ---- make targets
    Skip(r"^make demo$", "the whole path (bag, train, evaluate, serve), minutes; tests/project/test_demo_script.py runs it"),
    Skip(r"^make (test|test-quick)$", "the test suite itself"),
    Skip(r"^make bench$", "every benchmark, long; each bench script's own command is listed below"),
    Skip(r"^make fuzz$", "minutes of schemathesis against a server (tests/serving/fuzz_api.py)"),
    Skip(r"^make notebook$", "minutes; tests/project/test_quickstart_notebook.py checks what it stored and runs the notebook"),
    Skip(r"^make gpu-train$", "needs a GPU (CUDA build of TensorFlow)"),
    # ---- ehr-pipeline
    Run(r"^ehr-pipeline summarize --mimic-dir \.\./shared/mimic-iii-demo ", check="dead letters", process=True),
    # docs/results.md's medium release and docs/synthetic.md's two-site example (below) add no path: the
    # same synth, Beam job and ehr-eval forms run from the README (~60 s CPU of processes saved).
    Skip(r"^ehr-pipeline (synth --patients 7000 |run --mimic-dir out/medium/release )",
         "docs/results.md's medium release: the same synth and Beam job on a synthetic release as the README's "
         "`ehr-pipeline synth --patients 2000 --seed 0 --out out/synth` and `ehr-pipeline run --mimic-dir out/synth "
         "--out out/synth-data` (run), at another size and seed; the model trained on it takes tens of minutes",
         document="docs/results.md"),
    Skip(r"^ehr-pipeline (synth --patients 2000 --seed 11 |run --mimic-dir out/site-[ab] )",
         "docs/synthetic.md's two-site example: the same synth (--site B runs in the README and at the top of this "
         "document) and the same Beam job on a synthetic release as the README's `ehr-pipeline run --mimic-dir "
         "out/synth --out out/synth-data` (run), with another seed; its ehr-eval is skipped below",
         document="docs/synthetic.md"),
    Run(r"^ehr-pipeline synth ", check="deaths",
        subs=(("--patients 2000 ", "--patients 300 --events-scale 0.1 "),
              ("--patients 200 ", "--patients 200 --events-scale 0.1 ")),
        why="the commands after a synth do not depend on its size: 2000 patients take ~6 s CPU and make the "
            "Beam job on them ~30 s, 300 a fraction; "
            "a tenth of the events per ICU day (~30 instead of ~300) keeps the tables and about as many admissions "
            "(200 patients: 290 instead of 279) and cuts the synth and the Beam jobs after it about tenfold (the Beam job on 200 patients at the full "
            "rate took 92 s on the loaded 2-core machine). A document's own --events-scale, later on the line, "
            "still wins"),
    Run(r"^ehr-pipeline run --mimic-dir \.\./shared/mimic-iii-demo --out out/data ", check="wrote out/data"),
    Skip(r"^ehr-pipeline run --mimic-dir /data/mimic --out /data/seqex --direct_num_workers=2 "
         r"--direct_running_mode=multi_processing$",
         "the local multi-process runner with /data paths (a cluster's mount); docs/pipeline.md's example of "
         "the same runner (--workers) runs"),
    Run(r"^ehr-pipeline run --mimic-dir DIR --out out/data --workers 8 --overwrite$", check="wrote out/data",
        subs=(("DIR", SYNTHETIC), ("--workers 8", "--workers 2")),
        why="DIR is a placeholder: the small synthetic release (all 13 tables, as the demo's layout; the demo "
            "took 42 s here on the loaded 2-core machine, and the README runs the same job on it); 8 worker "
            "processes on a 2-core test machine: 2"),
    Run(r"^ehr-pipeline run --mimic-dir out/synth-b --out out/data-b --units-from runs/site-a/export$",
        check="wrote out/data-b", subs=((" --units-from runs/site-a/export", ""),),
        why="the suite's tiny trained run learnt from data without units.json (tests/support/ehr_testdata.py), so "
            "its export has none to convert to; an export trained on the Beam job's output carries it, and the "
            "README's --units-from command runs",
        document="docs/tasks/second_hospital.md"),
    Run(r"^ehr-pipeline run --mimic-dir out/", check="wrote out/"),
    Skip(r"--runner=(Flink|Spark|Dataflow)Runner", "needs a Flink or Spark cluster with Beam's job-server jars, "
                                                   "or Google Cloud credentials"),
    Skip(r"--runner=DaskRunner", "needs a dask.distributed scheduler; tests/ehr_pipeline/job/test_job.py runs the same job on a "
                                 "real local cluster, with relative paths from another working directory"),
    Skip(r"^ehr-pipeline run --mimic-dir DIR --out DIR \[", SYNOPSIS),
    Run(r"^ehr-pipeline shard --mimic-dir /data/mimic --table CHARTEVENTS --parts 16 --out /data/mimic-parts$",
        check="CHARTEVENTS", subs=(("/data/mimic-parts", "out/mimic-parts"), ("/data/mimic", SYNTHETIC)),
        why="/data is a cluster's mount: a small synthetic release (the demo has no CHARTEVENTS) and a local "
            "folder instead"),
    Run(r"^ehr-pipeline to-fhir --mimic-dir \.\./shared/mimic-iii-demo --hadm-id 142345 --out bundle\.json$",
        needs_demo=True),
    Run(r"^ehr-pipeline to-fhir --mimic-dir \.\./shared/mimic-iii-demo --hadm-id 142345 --out - ",
        check='"resourceType": "Bundle"', needs_demo=True),
    Skip(r"^ehr-pipeline demo --mimic-dir \.\./shared/mimic-iii-demo --out out/demo$",
         "the README's `ehr-pipeline run` runs the same Beam job on the same demo; tests/project/test_demo_script.py "
         "runs `ehr-pipeline demo`'s own entry point (scripts/demo.py's step 1) on a synthetic release; the "
         "ehr-eval after it is skipped below"),
    # docs/tasks/full_mimic.md: the credentialed release.
    Skip(r"^ehr-pipeline (summarize|run) --mimic-dir \.\./mimic-iii-1\.4 ",
         "needs the full MIMIC-III v1.4 (credentialed access) and half an hour (docs/pipeline.md, 'At full size'); "
         "the README runs both commands on the demo", document="docs/tasks/full_mimic.md"),
    Skip(r"^ehr-pipeline run --mimic-dir site-c/ ", "site-c/ stands for another site's release; the README's "
                                                     "--units-from command runs on synthetic site C",
         document="docs/units.md"),
    # ---- MEDS
    # The README's and docs/meds.md's MEDS commands add no path (they took 35 s of the README's commands, the
    # longest document's, on the loaded 2-core machine): the same commands' mains and the same demo are run by
    # the tests named here.
    Skip(r"^ehr-pipeline (to-meds|run --meds-dir out/meds) ",
         "the demo's to-meds is the session's demo_meds_conversion (tests/conftest.py), whose rows are all accounted "
         "for in tests/ehr_pipeline/meds/test_meds.py, and whose run --meds-dir gives the CSV run's examples there; "
         "`ehr-pipeline to-meds` and `ehr-pipeline run --meds-dir` run through the command's main in "
         "tests/ehr_pipeline/job/test_fault_injection.py and tests/ehr_pipeline/meds/test_meds_hostile.py"),
    Skip(r"MIMIC_IV_MEDS", "a MIMIC-IV MEDS dataset needs credentialed access; tests/ehr_pipeline/meds/test_meds_e2e.py runs MEDS "
                           "data nobody here wrote (meds-testing-helpers' sample and generator)"),
    Skip(r"^aces-cli ", "tests/support/meds_data.py computes the same task's labels with ACES in the test suite"),
    Skip(r"^meds-evaluation-cli ", "tests/ehr_pipeline/meds/test_meds_e2e.py scores ehr-eval's predictions.meds.parquet with "
                                   "meds-evaluation"),
    Skip(r"^ehr-eval --model runs/(rank1|x)/export --data out/data-meds ",
         "tests/ehr_pipeline/meds/test_meds_e2e.py runs ehr-eval on MEDS data (~30 s here)"),
    # ---- ehr-adapt (docs/model.md: a site's release bagged in the model's units, the model updated on it)
    Skip(r"^ehr-pipeline run --mimic-dir SITE_RELEASE ", "SITE_RELEASE is a placeholder for a site's release; the "
         "README's --units-from command runs on synthetic site C", document="docs/model.md"),
    Run(r"^ehr-adapt --model runs/site-a/export --data out/data-b --out runs/site-b --method bayes$",
        check="updated export: runs/site-b", subs=(("--method bayes", "--method bayes --epochs 2"),),
        why="what is checked is that the update runs and writes the export the page evaluates next, not how well "
            "it fits (tests/model/adapt/ and bench/methods/site_update.py measure that): the default 30 epochs "
            "took 46 s of the page's 75 here",
        document="docs/tasks/second_hospital.md"),
    Skip(r"^ehr-adapt --model runs/site-a/export --data out/data-c --out runs/site-c --method bayes$",
         "docs/tasks/second_hospital.md runs the same update (--method bayes on another site's data bagged "
         "--units-from the site-A model); tests/model/adapt/test_adapt_export.py runs every method",
         document="README.md"),
    Skip(r"^ehr-adapt --model runs/rank1/export --data site_data ",
         "site_data is the placeholder release bagged above; tests/model/adapt/test_adapt_export.py runs ehr-adapt "
         "on the tiny trained model and a relabelled site (every weight method too)", document="docs/model.md"),
    Skip(r"^ehr-eval (--model runs/rank1(_site)?(/export)? --data site_data|--compare eval/before/)",
         "on site_data (a placeholder); tests/model/adapt/test_adapt_export.py runs the same ehr-eval before and "
         "after and --compare on them", document="docs/model.md"),
    # ---- ehr-train
    Skip(r"^ehr-train ", TRAINING),
    # ---- ehr-eval
    Skip(r"^ehr-eval .*DATA_DIR", "DATA_DIR and the run folders are placeholders (a synopsis); the README's "
                                  "ehr-eval commands run the same forms"),
    Run(r"^ehr-eval --model runs/rank1/export --data out/data --split test --samples 25 --out runs/rank1-test$",
        check="nll", subs=(("--samples 25", "--samples 2 --bootstrap 100"),),
        why="the check is that it evaluates and prints the metrics, whatever the number of samples and resamples: "
            "25 samples and 1000 resamples cost ~2 s CPU more on the demo's test split"),
    Skip(r"^ehr-eval --model runs/det-0 --model runs/det-1 --model runs/det-2 --data out/(synth-)?data --export-ensemble ",
         "three runs evaluated and written as one ensemble export, ~60 s CPU; tests/model/evaluation/test_evaluate.py runs "
         "ehr-eval --model A --model B --export-ensemble on tiny runs"),
    Run(r"^ehr-eval --model runs/rank1/export --data out/synth-data --truth ", check="nll"),
    Run(r"^ehr-eval --baseline logistic --data out/synth-data ", check="nll"),
    # docs/tasks/train_evaluate.md's comparison: its ehr-eval --compare in this process (the README's is the one
    # command of ehr-eval run in a fresh process), and with --out, whose folder the page names.
    Run(r"^ehr-eval --compare runs/rank1/eval-synth/predictions\.csv runs/logistic/predictions\.csv --truth "
        r"out/synth/SYNTH_TRUTH\.csv --out runs/rank1-vs-logistic$", check="nll",
        document="docs/tasks/train_evaluate.md"),
    Run(r"^ehr-eval --compare eval/site-b-before/predictions\.csv eval/site-b-after/predictions\.csv --out ",
        check="nll", document="docs/tasks/second_hospital.md"),
    # ehr-eval's command in a fresh process: --compare, its cheapest (no export, no data folder to load).
    Run(r"^ehr-eval --compare ", check="nll", process=True),
    Skip(r"^ehr-eval --model out/demo/run/export --data out/demo/data --split test --samples 25 --out out/demo/eval "
         r"--overwrite$",
         "make demo's step 3 on out/demo/data (its `ehr-pipeline demo` is skipped above): the README's ehr-eval runs "
         "on the same demo's Beam output, and tests/project/test_demo_script.py runs the demo's steps; ~35 s CPU of "
         "Beam, TensorFlow and the export's load"),
    Skip(r"^ehr-eval --model runs/mimic-rank1/export --data out/mimic ",
         "needs the full MIMIC-III and its trained model (docs/tasks/full_mimic.md)", document="docs/tasks/full_mimic.md"),
    # docs/tasks/second_hospital.md: site B scored by the site-A model before and after ehr-adapt, and compared.
    Run(r"^ehr-eval --model runs/site-(a/export|b) --data out/data-b --split test --out eval/site-b-(before|after)$",
        check="nll", subs=(("--split test", "--split test --samples 2 --bootstrap 100"),),
        why="the check is that it evaluates the export before and after the update on site B and writes the "
            "folders the page names, whatever the number of samples and resamples",
        document="docs/tasks/second_hospital.md"),
    Skip(r"^ehr-eval --model runs/site-a/export --data out/site-b-data ",
         "on site B's data bagged above (skipped): the same ehr-eval --model EXPORT --data DATA --truth TRUTH on a "
         "synthetic release's Beam output as the README's (run); ~25 s CPU of TensorFlow and the export's load",
         document="docs/synthetic.md"),
    Skip(r"^ehr-eval +--run runs/digits_r1 ", "needs the digits run of the ehr-train command before it"),
    Skip(r"^ehr-eval --model out/medium/", "needs the medium release and a model trained on it (tens of minutes)",
         document="docs/results.md"),
    Skip(r"^ehr-eval +--run runs/c10 ", "needs CIFAR-10, CIFAR-10-C and a WRN-28-10 run (a GPU)"),
    # ---- ehr-analyze
    Run(r"^ehr-analyze shift --model runs/site-a/export --data out/data-c ", check="shift:",
        exit_codes=(0, 3), process=True),
    Run(r"^ehr-analyze shift --model runs/site-a/export --data out/data-b --out shift/site-b$", check="shift:",
        exit_codes=(0, 3), document="docs/tasks/second_hospital.md"),
    Skip(r"^ehr-analyze posterior-rank --model runs/fully_bayesian --data (out/data|DATA_DIR) --split validation$",
         "needs a trained fully_bayesian run (training is skipped); tests/model/evaluation/test_posterior_rank.py runs the command"),
    Skip(r"^ehr-analyze posterior-rank .*\[", SYNOPSIS),
    Skip(r"^ehr-analyze posterior-rank --model runs/digits_mean_field ",
         "needs a trained digits mean-field run; tests/model/evaluation/test_posterior_rank.py runs the command on a tiny one"),
    # ---- benchmarks
    Skip(r"^python bench/(methods/(compare_methods|learning_curve|coverage_bound|site_update)|"
         r"image_models/image_results)\.py",
         "a results benchmark: many minutes to hours on 2 cores"),
    Skip(r"^python bench/data_jobs/pipeline\.py$", "1M, 4M and 16M events: minutes"),
    # A benchmark exits 1 when this machine misses a speed target: whether the script works is what is checked.
    Run(r"^python bench/data_jobs/pipeline\.py --sizes 200000 --no-write$", check="events/s", exit_codes=(0, 1),
        subs=(("--sizes 200000", "--sizes 10000"),),
        why="whether the script works is what is checked, not the speed: its Beam job and bare parse on 10k "
            "events (~7 patients) take the same code path as on 200k (the job ~19 CPU-s less than at 50k)"),
    # ---- ehr-serve and its clients
    Run(r"^export EHR_API_KEYS="),
    Run(r"^ehr-serve --help$", check="--precision"),
    Skip(r"^ehr-serve --model out/demo/run/export$", "the same command runs in docs/fhir.md (a server start costs "
                                                 "~10 s CPU)", document="docs/serving.md"),
    Skip(r"^ehr-serve --model out/demo/run/export --no-auth$", "--no-auth runs with docs/serving.md's "
                                                           "`ehr-serve --model out/tiny-export --no-auth`"),
    Skip(r"^ehr-serve --model out/demo/run/export --host 127\.0\.0\.1 --port 8000 --api-keys-file keys\.txt$",
         "keys.txt is the hospital's key file; the same export starts in docs/tasks/demo.md (run), "
         "test_documented_ehr_serve_settings_are_accepted reads this command's key file, and "
         "tests/serving/test_serving_startup.py serves with --api-keys-file", document="docs/tasks/deploy.md"),
    Skip(r"^ehr-serve --model out/demo/run/export .*--api-keys-file /run/secrets/ehr_keys",
         "/run/secrets is a deployment's secret mount; the same start on a trained export runs in the README and "
         "docs/fhir.md (a start costs ~15 s CPU), test_documented_ehr_serve_settings_are_accepted reads this "
         "command's key file, and tests/serving/test_serving_startup.py serves with --api-keys-file",
         document="docs/serving.md"),
    Skip(r"^ehr-serve --model-repository models --traffic-split ",
         "needs a repository of two exports (models/NAME/1, models/NAME/2); tests/serving/test_model_versions.py "
         "serves one from the same flags (a 90/10 split, beside a broken third version) on a real server",
         document="docs/serving.md"),
    Run(r"^(EHR_API_KEYS=\S+ )?ehr-serve --model "),
    Run(r"^python -c \"from serving\.tools\.tiny_export import write_tiny_model_export"),
    Skip(r"^python -m serving\.tools\.demo --model out/demo/run/export ",
         "make demo's step 4 on out/demo/data (skipped above); tests/project/test_demo_script.py runs it"),
    Skip(r"^curl .*\{\.\.\.Patient\.\.\.\}", "abridged: {...Patient...} stands for the prefetched resources; "
                                             "tests/serving/test_fhir_api.py posts whole ones"),
    Run(r"^curl .*/fhir/r4/", check='"resourceType":"RiskAssessment"', needs_demo=True),
    Run(r"^curl .*/cds-services ", check='"services":'),
    Run(r"^curl .*/v1/predict", check='"probability":'),
    Skip(r"^docker ", "needs a Docker daemon and minutes to build the image"),
]


# ------------------------------------------------------------------------------ extraction


def all_commands() -> list[Command]:
    return [c for path in DOCUMENTS for c in document_commands(path)]


def classify(command: Command) -> Run | Skip | None:
    """The first COMMANDS entry whose pattern matches the command, or None."""
    return next((entry for entry in COMMANDS if re.search(entry.pattern, command.flat)
                 and entry.document in (None, command.document)), None)


# ------------------------------------------------------------------------------ the quick checks


def test_every_documented_command_is_run_or_skipped_with_a_reason():
    commands = all_commands()
    assert len(commands) > 50  # the extraction finds the documents' commands at all
    unclassified = [str(c) for c in commands if classify(c) is None]
    assert not unclassified, ("documented commands neither run nor skipped: add each to COMMANDS in "
                              "tests/project/test_documented_commands.py\n" + "\n".join(unclassified))
    used = {id(classify(c)) for c in commands}
    stale = [entry.pattern for entry in COMMANDS if id(entry) not in used]
    assert not stale, f"COMMANDS entries that match no documented command (remove them): {stale}"


def test_each_console_script_run_here_runs_one_command_in_a_fresh_process():
    # The rest of its commands call its main in this process: one still crosses the process boundary.
    run = [(c, e) for c in all_commands() if isinstance(e := classify(c), Run)]
    assert all(_words(c)[0] in IN_PROCESS for c, e in run if e.process), "process is for IN_PROCESS scripts"
    for program in IN_PROCESS:
        fresh = [c for c, e in run if _words(c)[:1] == [program] and e.process and not e.needs_demo]
        assert len(fresh) == 1, f"{program}: mark one Run as process=True (its cheapest), not {fresh}"


def test_no_command_block_goes_unlabelled():
    unlabelled = []
    for path in DOCUMENTS:
        for language, first, lines in fenced_blocks(path):
            words = next((line.split() for line in lines if line.strip()), [""])
            if not language and words[0] in PROGRAMS:
                unlabelled.append(f"{path.relative_to(REPO_ROOT)}:{first}: {lines[0]}")
    assert not unlabelled, "label these blocks ```bash so their commands are checked:\n" + "\n".join(unlabelled)


def test_the_extraction_joins_continuations_and_quotes_and_drops_comments(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "```bash", "# a comment line", "tool --a 1 \\", "    --b 'x # y'   # trailing comment",
        "curl -d '{", '  "k": 1}\'', "", "```", "```console", "$ tool --c", "output line", "```",
        "```python", "tool --not-shell", "```"]) + "\n")
    commands = document_commands(doc)
    assert [c.text for c in commands] == ["tool --a 1 --b 'x # y'", "curl -d '{\n  \"k\": 1}'", "tool --c"]
    assert [c.line for c in commands] == [3, 5, 10]


def _parsers(program: str, argv: list[str]) -> list:
    """The argument parsers whose flags `program argv` may use (both families for ehr-train / ehr-eval)."""
    if program == "ehr-pipeline":
        from ehr_pipeline.cli import build_parser

        sub = next((a for a in argv if not a.startswith("-")), None)
        parser = build_parser()
        choices = next(a for a in parser._actions if a.dest == "command").choices
        return [parser, choices[sub]] if sub in choices else [parser]
    if program == "ehr-train":
        from model.cli import ehr_train
        from model.image import cli as image_cli

        return [ehr_train.build_parser(), image_cli.build_train_parser()]
    if program == "ehr-eval":
        from model.cli import ehr_eval
        from model.image import cli as image_cli

        return [ehr_eval.build_parser(), image_cli.build_eval_parser()]
    if program == "ehr-analyze":
        from model.cli import ehr_analyze

        parser = ehr_analyze.build_parser()
        choices = next(a for a in parser._actions if getattr(a, "choices", None) and isinstance(a.choices, dict))
        return [parser, *choices.choices.values()]
    if program == "ehr-serve":
        from serving import cli

        return [cli.build_parser()]
    if program == "ehr-adapt":
        from model.cli import ehr_adapt

        return [ehr_adapt.build_parser()]
    if program.startswith("bench/"):
        import importlib.util

        spec = importlib.util.spec_from_file_location(f"bench_{pathlib.Path(program).stem}", REPO_ROOT / program)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
        spec.loader.exec_module(module)
        return [module.build_parser()] if hasattr(module, "build_parser") else []
    return []


def _words(command: Command) -> list[str]:
    """The command's words after leading VAR=value assignments; `python script.py` gives the script first."""
    words = shlex.split(command.flat.replace("$(", "(")) if "$(" in command.flat else shlex.split(command.flat)
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words.pop(0)
    if words[:1] == ["python"] and len(words) > 1 and words[1].endswith(".py"):
        words.pop(0)
    return words


def _beam_flags(args: list[str]) -> set[str]:
    """Every flag of Beam's registered pipeline options (the Dask runner's too, when args name it)."""
    from apache_beam.options import pipeline_options as beam_options

    from ehr_pipeline.job import pipeline_options

    pipeline_options(args)  # imports the Dask runner's options class when asked for, as the job does

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    parser = beam_options._BeamArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    for cls in set(subclasses(beam_options.PipelineOptions)):
        cls._add_argparse_args(parser)
    return {s for action in parser._actions for s in action.option_strings}


def test_skipped_and_run_commands_use_only_flags_their_tool_knows():
    problems = []
    for command in all_commands():
        words = _words(command)
        if not words or "[" in command.flat:  # synopses: their words are placeholders
            continue
        parsers = _parsers(words[0], words[1:])
        if not parsers:
            continue
        known = {s for p in parsers for a in p._actions for s in a.option_strings}
        flags = [w.split("=", 1)[0] for w in words[1:] if w.startswith("--")]
        unknown = [f for f in flags if f not in known]
        if unknown and words[:2] == ["ehr-pipeline", "run"]:  # the rest go to Beam
            unknown = [f for f in unknown if f not in _beam_flags(words[2:])]
        if unknown:
            problems.append(f"{command}: unknown flag(s) {unknown}")
    assert not problems, "\n".join(problems)


def test_documented_ehr_serve_settings_are_accepted(tmp_path):
    # What ehr-serve checks before it loads a model (keys, host, limits), for every documented ehr-serve,
    # run or skipped: a refused setting fails here in seconds (README's example key was too short).
    from serving import cli

    keys_file = tmp_path / "keys"
    keys_file.write_text(secrets.token_urlsafe(32) + "\n")
    checked = 0
    for command in all_commands():
        words = shlex.split(command.flat)
        env = {"EHR_API_KEYS": secrets.token_urlsafe(32)}  # as docs/serving.md's `export` sets it
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if words[:1] != ["ehr-serve"] or "--help" in words:
            continue
        argv = [str(keys_file) if previous == "--api-keys-file" else w for previous, w in zip(["", *words], words)]
        try:
            cli.settings_from_args(cli.build_parser().parse_args(argv[1:]), env)
        except cli.SettingsError as err:
            pytest.fail(f"{command}: ehr-serve refuses it: {err}")
        checked += 1
    assert checked >= 5


def test_documented_training_configs_and_overrides_load():
    from ehr_base.yaml_config import read_yaml
    from model.cli.ehr_train import parse_overrides
    from model.image.config import is_image_config, load_config as load_image_config
    from model.ehr.config import load_config

    checked = 0
    for command in all_commands():
        words = _words(command)
        if words[:1] != ["ehr-train"] or "[" in command.flat:
            continue
        config = REPO_ROOT / words[words.index("--config") + 1]
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        if is_image_config(read_yaml(config)):
            load_image_config(config)
        else:
            load_config(config).with_overrides(**parse_overrides(sets))
        checked += 1
    assert checked >= 8


# ------------------------------------------------------------------------------ running them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_on_loopback(text: str, port: int) -> str:
    """An ehr-serve command bound to 127.0.0.1:port (the documents bind 0.0.0.0 and 8000 or 8080)."""
    text = re.sub(r"--host \S+", "--host 127.0.0.1", text)
    return re.sub(r"--port \S+", f"--port {port}", text) if "--port" in text else f"{text} --port {port}"


# The console scripts whose later commands call their main in this process (pyproject.toml's entry points).
IN_PROCESS = {"ehr-pipeline": "ehr_pipeline.cli:main", "ehr-eval": "model.cli.ehr_eval:main",
              "ehr-analyze": "model.cli.ehr_analyze:main"}


@dataclasses.dataclass
class InProcess:
    """The documents' calls of console scripts' mains in this process, one at a time (the working folder
    and sys.stdout are the process's); each script's command marked ``Run.process`` runs in a fresh process."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def main_for(self, text: str, entry: Run):
        """What runs `text` here, a function of its argv returning the exit code; None for a subprocess (a
        program not in IN_PROCESS, shell syntax, or the console script's command marked ``process``).

        ``python -c CODE`` runs CODE here as __main__ (it is no console script: no first run in a process).
        """
        if re.search(r"[$`*?\[~\\\n]", text):  # expansions, globs, escapes: the shell's to read
            return None
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        if any(set(w) <= set("();<>|&") for w in words) or re.match(r"^[A-Za-z_]\w*=", words[0]):
            return None  # a pipe, list, redirection or subshell; a leading assignment
        if words[:2] == ["python", "-c"] and len(words) == 3:
            return lambda argv: exec(compile(words[2], "<string>", "exec"), {"__name__": "__main__"})
        if words[0] not in IN_PROCESS or entry.process:
            return None
        module, _, name = IN_PROCESS[words[0]].partition(":")
        return getattr(importlib.import_module(module), name)

    def call(self, main, argv: list[str], work: pathlib.Path) -> tuple[int, str, str]:
        """main(argv) run in `work` as its program would run it: (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        with self.lock, contextlib.chdir(work), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's error, or a sys.exit inside
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        return int(code or 0), out.getvalue(), err.getvalue()


@dataclasses.dataclass
class DocumentSession:
    """One document's commands, run in order in one working folder, with the server the last ehr-serve started."""

    work: pathlib.Path
    env: dict[str, str]
    in_process: InProcess
    server: subprocess.Popen | None = None
    port: int | None = None
    ran: int = 0
    called_in_process: bool = False  # how the last command ran (for the timings)
    timings: list[str] = dataclasses.field(default_factory=list)  # wall seconds per command

    def run(self, command: Command, entry: Run) -> None:
        started = time.perf_counter()
        try:
            self._run(command, entry)
        finally:
            where = "in process" if self.called_in_process else "process   "
            self.timings.append(f"{time.perf_counter() - started:6.1f} s  {where}  {command}"[:160])

    def _run(self, command: Command, entry: Run) -> None:
        self.called_in_process = False
        text = command.text
        for old, new in entry.subs:
            text = text.replace(old, new)
        words = _words(command)
        if words[:1] == ["ehr-serve"] and "--help" not in words:
            return self.start_server(command, text)
        if words[:1] == ["curl"]:
            assert self.port, f"{command}: no ehr-serve was started before it in {command.document}"
            text = re.sub(r"(localhost|127\.0\.0\.1):8000", f"127.0.0.1:{self.port}", text)
        exported = re.match(r"^export ([A-Za-z_]\w*)=", text)
        script = f'{text}\nprintf %s "${{{exported.group(1)}}}"' if exported else text
        main = self.in_process.main_for(text, entry)
        self.called_in_process = main is not None
        if main is not None:
            returncode, stdout, stderr = self.in_process.call(main, shlex.split(text)[1:], self.work)
        else:
            proc = subprocess.run(["bash", "-c", script], cwd=self.work, env=self.env, capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S)
            returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        assert returncode in entry.exit_codes, \
            f"{command}\nexit code {returncode}\n{stdout[-2000:]}\n{stderr[-3000:]}"
        assert entry.check in stdout, f"{command}\ndid not print {entry.check!r}:\n{stdout[-3000:]}"
        if exported:
            self.env[exported.group(1)] = stdout
        self.ran += 1

    def start_server(self, command: Command, text: str) -> None:
        self.stop_server()
        self.port = _free_port()
        log = self.work / f"ehr-serve-{command.line}.log"
        with open(log, "wb") as out:
            self.server = subprocess.Popen(["bash", "-c", serve_on_loopback(text, self.port)], cwd=self.work,
                                           env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while True:
            assert self.server.poll() is None, f"{command}\nexited {self.server.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{command}\nnot ready in 300 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        self.ran += 1

    def stop_server(self) -> None:
        if self.server is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, signal.SIGTERM)  # its own session: bash and ehr-serve, nothing else
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self.server = None


@pytest.fixture(scope="module")
def small_release(tmp_path_factory) -> pathlib.Path:
    """A small synthetic release (120 patients, all 13 tables), for the demo's place when it is missing."""
    from ehr_pipeline.synth import SynthConfig, write_release

    release = tmp_path_factory.mktemp("small_release") / "release"
    # A tenth of the events per ICU day: the same tables and admissions for shard and the jobs, less to bag.
    write_release(SynthConfig(patients=120, seed=0, events_scale=0.1), release, show_progress=False)
    return release


def prepare(work: pathlib.Path, small_release: pathlib.Path, trained_run: pathlib.Path) -> dict[str, str]:
    """A working folder where the documents' relative paths exist; returns the environment to run in."""
    (work / "run").mkdir(parents=True)
    (work / "shared").mkdir()
    (work / "shared" / "mimic-iii-demo").symlink_to(DEMO_DIR if demo_available() else small_release)
    (work / "shared" / "synthetic-release").symlink_to(small_release)
    for name in LINKED:
        (work / "run" / name).symlink_to(REPO_ROOT / name)
    for name in TRAINED_RUNS:
        shutil.copytree(trained_run, work / "run" / name, ignore=shutil.ignore_patterns("tensorboard"))
    key = secrets.token_urlsafe(32)
    bin_dir = str(pathlib.Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "EHR_API_KEYS": key,
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("PYTHONPATH", None)  # as a reader's shell: the installed package, not the test runner's path
    return env


def run_document(document: pathlib.Path, session: DocumentSession) -> list[str]:
    """Runs a document's Run commands in order in `session`; returns the commands left for the real demo."""
    not_run = []
    try:
        for command in document_commands(document):
            entry = classify(command)
            if not isinstance(entry, Run):
                continue
            if entry.needs_demo and not demo_available():
                not_run.append(str(command))
                continue
            session.run(command, entry)
    finally:
        session.stop_server()
    if document.parent.name == "tasks" and not not_run:
        assert_outputs_written(document, session.work)
    return not_run


def assert_outputs_written(document: pathlib.Path, work: pathlib.Path) -> None:
    """Each output path a task page names, where the run wrote it: a Run command's, or a trained run's copy."""
    outputs, _ = attributed_outputs(document)  # which command writes what: test_doc_paths_flags.py's to check
    missing = [f"line {o.line}: {o.path}" for o in outputs
               if (o.command is not None and isinstance(classify(o.command), Run)
                   or any(o.path == t or o.path.startswith(t + "/") for t in TRAINED_RUNS))
               and not (work / o.path).exists()]
    assert not missing, (f"{document.relative_to(REPO_ROOT)}: paths the page names, not written by its "
                         "commands here:\n" + "\n".join(missing))


@pytest.mark.slow
def test_documented_commands_run_as_written(small_release, trained_rank1, tmp_path):
    # Two documents at a time: most commands keep one core busy (imports, Python), and each document
    # has its own folder and server, so the 2-core machine finishes in about half the time. Measured
    # on 2 cores shared with other jobs (load average ~10): 842 s for the 37 commands run (1,269 s of
    # command time over the two threads; 1,023 s and 2,023 s for the 47 run before the skips of
    # duplicated paths above), plus the trained_rank1 fixture the suite builds anyway; -rA prints each
    # command's seconds. With the later commands of each console script called in this process
    # (InProcess), the module took 196-230 CPU-seconds (this process and its children, trained_rank1
    # included) against 252 with a process per command, on the same loaded 2-core machine.
    runs = {d: sum(isinstance(classify(c), Run) for c in document_commands(d)) for d in DOCUMENTS}
    documents = sorted((d for d in DOCUMENTS if runs[d]), key=lambda d: -runs[d])  # the longest first
    failures, not_run, timings = [], [], []
    in_process = InProcess()

    def one(document: pathlib.Path) -> None:
        work = tmp_path / document.stem
        session = DocumentSession(work / "run", prepare(work, small_release, trained_rank1["run"]), in_process)
        try:
            not_run.extend(run_document(document, session))
        except AssertionError as err:
            failures.append(str(err))
        finally:
            timings.extend(session.timings)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, documents))
    print("\n".join(timings))  # shown with -rA or -s: what each documented command costs
    assert not failures, "\n\n".join(failures)
    if not_run:
        pytest.skip(f"{len(not_run)} command(s) need the real demo ({DEMO_MISSING}): {not_run}")
