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
