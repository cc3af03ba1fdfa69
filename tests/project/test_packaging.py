"""The wheel: built from the sources, installed into a fresh virtual environment, every console script answers --help.

Installing TensorFlow and Beam afresh takes minutes, so the fresh environment installs only the
wheel (--no-deps) and sees the running environment's packages through a .pth file; the test
checks that the project's own modules are the wheel's, not the source tree's.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile

import pytest

import ehr_base
from tests.support.paths import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
PACKAGES = ("ehr_base", "ehr_pipeline", "model", "serving")


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the sources (the build leaves no build/ or egg-info in the checkout)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                 "-q", "-w", str(dist), str(src)])
    assert proc.returncode == 0, proc.stderr
    (path,) = dist.glob("*.whl")
    return path


def test_version_is_defined_once_and_the_wheel_carries_it(wheel):
    assert PYPROJECT["project"]["dynamic"] == ["version"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ehr_base.__version__"}
    assert wheel.name.startswith(f"ehr_uncertainty-{ehr_base.__version__}-")
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(ehr_base.__version__)}\]", changelog, re.M), \
        "CHANGELOG.md has no section for the current version"


def test_the_wheel_declares_every_console_script(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (entry_points,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(entry_points).decode()
        names = zf.namelist()
    declared = dict(re.findall(r"^(\S+) = (\S+)$", text.split("[console_scripts]")[1], re.M))
    assert declared == SCRIPTS
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names
    assert not any(n.startswith(("tests/", "bench/", "scripts/")) for n in names)


def test_the_wheel_leaves_out_the_tools_the_service_never_imports(wheel):
    # serving/tools/ (demo, server process, tiny test export) runs from a checkout; the service's own rooms ship.
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.startswith("serving/tools/")]
    for room in ("api", "inference", "monitoring"):
        assert f"serving/{room}/__init__.py" in names


@pytest.mark.slow
def test_fresh_environment_runs_every_console_script_from_the_wheel(wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    proc = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                 str(wheel)])
    assert proc.returncode == 0, proc.stderr
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # Written after the install, so pip never sees (or touches) the running environment's packages.
    (env_dir / site.split(str(env_dir) + os.sep, 1)[1] / "_running_env.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = _run([str(python), "-c", "import ehr_pipeline, model, serving; "
                  "print('\\n'.join(m.__file__ for m in (ehr_pipeline, model, serving)))"], cwd=tmp_path, env=env)
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert path.startswith(site), f"{path} is not the wheel's copy in {site}"
    for script in SCRIPTS:
        proc = _run([str(env_dir / "bin" / script), "--help"], cwd=tmp_path, env=env)
        assert proc.returncode == 0, f"{script} --help: {proc.stderr[-2000:]}"
        assert proc.stdout.startswith(f"usage: {script}"), proc.stdout[:200]
        assert "Traceback" not in proc.stderr
