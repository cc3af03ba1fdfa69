"""Where the suite finds the checkout and the real MIMIC-III demo (one place, so no test climbs parents)."""
from __future__ import annotations

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# The real MIMIC-III demo lives beside the checkout and is never copied into it;
# $MIMIC_DEMO_DIR points the suite at a copy somewhere else.
DEMO_DIR = pathlib.Path(os.environ.get("MIMIC_DEMO_DIR") or REPO_ROOT.parent / "shared" / "mimic-iii-demo").resolve()
DEMO_MISSING = (
    f"needs the real MIMIC-III Clinical Database Demo v1.4 (open access, ODbL) at {DEMO_DIR}: download it "
    "from PhysioNet (physionet.org/content/mimiciii-demo/1.4/) and put its tables there as TABLE.csv.gz, or "
    "set MIMIC_DEMO_DIR (README 'Data')")


def demo_available() -> bool:
    """Whether the real demo's tables are where the suite looks for them."""
    return (DEMO_DIR / "ADMISSIONS.csv.gz").is_file()
