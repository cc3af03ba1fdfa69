"""Scripts that are not packages (bench/, scripts/) loaded as modules, for the tests of their pure parts."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

from tests.support.paths import REPO_ROOT


def load_script(relative: str, name: str) -> types.ModuleType:
    """The script at REPO_ROOT / relative, loaded as module `name` (registered in sys.modules)."""
    # bench/ is not installed: its scripts import their neighbours as bench.FAMILY.NAME from the root.
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(REPO_ROOT) / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module
