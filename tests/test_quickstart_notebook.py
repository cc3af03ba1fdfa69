"""examples/quickstart.ipynb runs top to bottom against the current code (tiny sizes), so it cannot rot."""
from __future__ import annotations

import base64

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO_ROOT

NOTEBOOK = REPO_ROOT / "examples" / "quickstart.ipynb"


def _outputs(nb, kind):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == kind]


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code"), \
        "clear the outputs before committing (the tests execute the notebook)"


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path, monkeypatch):
    for name, value in {"PATIENTS": 200, "STEPS": 20, "SAMPLES": 2, "BOOTSTRAP": 20}.items():
        monkeypatch.setenv(f"QUICKSTART_{name}", str(value))
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("QUICKSTART_REPO", str(REPO_ROOT))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.delenv("EHR_API_KEYS", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    assert not _outputs(nb, "error")
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream") if o.get("name") == "stdout")
    assert "every record accounted for: yes" in text
    assert "rank1: 20 steps" in text and "deterministic: 20 steps" in text
    assert '"probability"' in text and "true probability of death" in text
    images = [o["data"]["image/png"] for o in _outputs(nb, "display_data") if "image/png" in o.get("data", {})]
    assert len(images) == 6  # reliability, risk-coverage, uncertainty vs error, for both models
    assert all(base64.b64decode(png).startswith(b"\x89PNG") for png in images)
    for name in ("rank1", "deterministic"):
        assert (tmp_path / "work" / "eval" / name / "metrics.json").is_file()
