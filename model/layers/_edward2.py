"""The one place that imports edward2; everything else does ``from model.layers._edward2 import ed``.

edward2 0.0.2 imports its NumPy backend first and only guards it against ImportError;
under SciPy >= 1.11 that backend fails with an AttributeError instead, which breaks
``import edward2`` altogether. We only use the TensorFlow backend, so the NumPy
submodule is marked as absent in ``sys.modules`` before the import: edward2 then sees
an ImportError, skips that backend and loads the TensorFlow one as usual.
"""
from __future__ import annotations

import sys
import warnings

import ehr_base  # noqa: F401  (pins TF_USE_LEGACY_KERAS before TensorFlow loads)

# setdefault: leave a real module alone if some caller already imported it successfully.
sys.modules.setdefault("edward2.numpy", None)

with warnings.catch_warnings():
    # edward2 warns that the (deliberately blocked) NumPy backend is unavailable.
    warnings.filterwarnings("ignore", message="NumPy backend for Edward2 is not available")
    import edward2 as ed  # noqa: E402

__all__ = ["ed"]
