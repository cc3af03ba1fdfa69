"""ehr-train / ehr-eval send task: image configs to the image models and the rest to the EHR model."""
import json

from model.cli import ehr_eval, ehr_train


def test_image_config_goes_through_ehr_train_and_ehr_eval(tmp_path):
    run = tmp_path / "run"
    assert ehr_train.main(["--config", "configs/image_digits_deterministic.yaml", "--out", str(run),
                           "--steps", "20", "--no-eval", "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["task"] == "image"
    assert ehr_eval.main(["--model", str(run), "--samples", "1", "--no-corruptions", "--no-progress"]) == 0


def test_ehr_config_is_not_taken_for_an_image_one():
    from model.image.cli import wants_image

    assert not wants_image(["--config", "configs/ehr_demo.yaml", "--data", "x", "--out", "y"])
    assert wants_image(["--config=configs/image_digits_rank1_normal.yaml", "--out", "y"])
