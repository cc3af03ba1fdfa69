"""bench/methods/counterfactual.py's variants: early stopping and time inputs reach the runs' configs, in folders of their own."""
from __future__ import annotations


import pytest

from tests.support.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/methods/counterfactual.py", "bench_counterfactual_under_test")


@pytest.fixture
def scales(bench):
    """compare_setup.SCALES, restored after the test: the bench registers its variants there."""
    from bench.methods.compare_setup import SCALES

    saved = dict(SCALES)
    yield SCALES
    SCALES.clear()
    SCALES.update(saved)


def test_time_inputs_and_early_stopping_reach_the_run_config_and_name_their_runs(bench, scales):
    from bench.methods.compare_runs import run_config

    plain = bench.build_parser().parse_args(["--scale", "tiny"])
    both = bench.build_parser().parse_args(["--scale", "tiny", "--early-stop", "--time-inputs", "since_admit",
                                            "bag_gap"])
    assert bench._tag(plain) == "" and bench._tag(both) == "_esmin_ti-bag_gap-since_admit"
    config = run_config("deterministic", 11, bench._train_args(both))
    assert "tiny+early_stop+time_inputs" in scales
    assert set(config.model.time_inputs) == {"bag_gap", "since_admit"}
    assert config.train.lr_schedule == "plateau" and config.train.max_steps == 600
    assert config.train.early_stopping_min_steps == 300  # half the scale's steps
    assert run_config("deterministic", 11, bench._train_args(plain)).model.time_inputs == ()
    with pytest.raises(SystemExit):  # an input the model does not have is refused by the parser
        bench.build_parser().parse_args(["--time-inputs", "slope_of_creatinine"])



def test_set_overrides_reach_the_run_config_and_name_their_runs(bench, scales):
    from bench.methods.compare_runs import run_config

    args = bench.build_parser().parse_args(["--scale", "tiny", "--set", "model.rnn_dim=64", "--set",
                                            "train.learning_rate=1e-3"])
    assert bench._tag(args) == "_rnn_dim-64_learning_rate-1e-3"  # sorted by SECTION.KEY
    config = run_config("rank1_normal", 11, bench._train_args(args))
    assert config.model.rnn_dim == 64 and config.train.learning_rate == pytest.approx(1e-3)
    assert config.model.hidden_layer_dim == 32  # the rest stays the scale's
    for bad, match in ((["--set", "eval.num_samples=3"], "only model. and train."), (["--set", "rnn_dim"], "SECTION.KEY")):
        with pytest.raises(SystemExit, match=match):
            bench._train_args(bench.build_parser().parse_args(bad))

def test_the_factual_table_gives_the_truth_its_own_coefficients_and_pairs_each_row_with_the_first(bench):
    import argparse

    import numpy as np

    rng = np.random.default_rng(0)
    n = 300
    design = rng.normal(0, [1.0] * 9 + [0.1, 1.0], (n, 11))  # nine linear terms, then trend and readmission
    truth = 1.0 / (1.0 + np.exp(-(-2.0 + design[:, :9] @ np.full(9, 0.2) + 10.0 * design[:, 9] + design[:, 10])))
    half = 1.0 / (1.0 + np.exp(-(-2.0 + design[:, :9] @ np.full(9, 0.2) + 5.0 * design[:, 9])))
    scores = {"truth_itself": {"before": truth[:, None], "K": 1, "S": 1},
              "half_the_trend": {"before": np.repeat(half[:, None], 4, axis=1), "K": 4, "S": 1}}
    lines = bench.factual_lines(argparse.Namespace(n_bootstrap=50, seed=0), scores, design, truth)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    assert rows["truth_itself"][1].startswith("0.0000") and rows["truth_itself"][2] == "-"
    assert rows["truth_itself"][3].startswith("10.00") and rows["truth_itself"][4].startswith("1.00")
    assert rows["half_the_trend"][3].startswith("5.00") and rows["half_the_trend"][4].startswith("0.00")
    assert rows["half_the_trend"][2].startswith("+")  # farther from the truth than the first row, on the same cases
    assert rows["half_the_trend"][5].rstrip(" |") == "0.00"  # four identical members: a zero-width interval


def test_a_linear_truth_gets_the_factual_table_without_trajectory_columns(bench):
    import argparse

    import numpy as np

    rng = np.random.default_rng(1)
    design = rng.normal(0, 1.0, (200, 9))  # the linear truth's nine terms, no trajectory
    truth = 1.0 / (1.0 + np.exp(-(-2.0 + design @ np.full(9, 0.3))))
    scores = {"truth_itself": {"before": truth[:, None], "K": 1, "S": 1},
              "shrunk": {"before": np.repeat((0.5 * truth)[:, None], 2, axis=1), "K": 2, "S": 1}}
    lines = bench.factual_lines(argparse.Namespace(n_bootstrap=50, seed=0), scores, design, truth, trajectory=False)
    header = next(line for line in lines if line.startswith("| method"))
    assert "coef." not in header and header.count(" | ") == 3
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    assert len(rows["shrunk"]) == 4 and rows["shrunk"][2].startswith("+")
    assert bench.build_parser().parse_args(["--truth", "linear"]).truth == "linear"
