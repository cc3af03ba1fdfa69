"""NannyML's CBPE on files the performance-estimate bench wrote: run with the nannyml environment's python.

  VENV/bin/python bench/methods/nannyml_cbpe.py FOLDER THRESHOLD

FOLDER holds reference.csv (p, y: the model's validation split) and analysis.csv (p: the new
site's test split). CBPE is fitted on the reference (its calibrator included) and estimates the
ROC AUC of the whole analysis set as one chunk. Prints one JSON line {"roc_auc": ...}. Kept apart
from the product: nannyml's dependencies would change the product's pinned packages
(bench/requirements-nannyml.txt).
"""
from __future__ import annotations

import json
import sys

import nannyml as nml
import pandas as pd


def main(folder: str, threshold: float) -> None:
    reference = pd.read_csv(f"{folder}/reference.csv")
    analysis = pd.read_csv(f"{folder}/analysis.csv")
    frames = []
    for frame in (reference, analysis):
        frame = frame.rename(columns={"p": "y_pred_proba"})
        frame["y_pred"] = (frame["y_pred_proba"] > threshold).astype(int)
        frames.append(frame)
    reference, analysis = frames
    reference["y"] = reference["y"].astype(int)
    estimator = nml.CBPE(y_pred_proba="y_pred_proba", y_pred="y_pred", y_true="y", metrics=["roc_auc"],
                         problem_type="classification_binary", chunk_number=1)
    estimator.fit(reference)
    result = estimator.estimate(analysis).filter(period="analysis").to_df()
    value = float(result[("roc_auc", "value")].iloc[0])
    print(json.dumps({"roc_auc": value}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
