"""The settings of one update at a new site (ehr-adapt's flags are these fields, with these defaults)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The updating methods, simplest first: the classic ladder (none .. closed-test), then the weight updates.
METHODS = ("none", "recalibrate-intercept", "recalibrate", "closed-test", "finetune", "bayes", "retrain")
# The ones that change the network's weights (the others store a recalibration beside the parent's SavedModel).
WEIGHT_METHODS = ("finetune", "bayes", "retrain")
DEFAULT_METHOD = "closed-test"

Method = Literal["none", "recalibrate-intercept", "recalibrate", "closed-test", "finetune", "bayes", "retrain"]


class AdaptConfig(BaseModel):
    """How to update a model on a site's labelled admissions."""

    model_config = ConfigDict(extra="forbid")

    method: Method = Field(DEFAULT_METHOD, description="the update (model.adapt, docs/model.md)")
    split: str = Field("train", min_length=1, description="the local data folder's split that holds the labelled "
                                                          "admissions (its test split stays untouched for evaluation)")
    sample_size: int | None = Field(None, ge=10, description="draw this many admissions of the split (None: all)")
    seed: int = Field(0, ge=0, description="seed of the draw, the validation part, the samples and the weight fits")
    samples: int = Field(10, ge=1, le=100, description="S samples per member for every likelihood the update "
                                                       "fits or tests (the recalibration's, the closed test's)")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="closed test: level of each likelihood-ratio test")
    validation_fraction: float = Field(0.2, gt=0.0, lt=0.5, description="weight methods: share of the local "
                                       "admissions held out for early stopping (stratified by outcome)")
    epochs: int = Field(30, ge=1, description="weight methods: most passes over the local admissions")
    patience: int = Field(5, ge=1, description="weight methods: stop after this many epochs without a better "
                                               "validation NLL (the best epoch's weights are kept)")
    batch_size: int = Field(32, ge=1, description="weight methods: admissions per gradient step")
    learning_rate: float = Field(1e-3, gt=0.0, description="weight methods: Adam's step size (retrain uses the "
                                                           "parent's training learning rate)")
    bayes_learning_rate: float = Field(1e-2, gt=0.0, description="bayes: Adam's step size (it moves only the "
                                       "rank-1 factors and the output bias, a few hundred numbers)")
    bias_prior_stddev: float = Field(1.0, gt=0.0, description="bayes: prior stddev (logit) of the output bias "
                                     "around the trained one (a point estimate in training, so it has no posterior)")
    revision_steps: int = Field(200, ge=1, description="closed test: full-batch Adam steps of the revision fit")
    batch_predict: int = Field(256, ge=1, description="admissions per prediction call")
