"""The tiny image config that the image training and multi-device tests share (steps, not accuracy)."""

TINY = {
    "task": "image", "name": "tiny",
    "data": {"augment_flip": False, "augment_crop_padding": 1, "corruptions": ["contrast", "gaussian_noise"],
             "severities": [1, 5]},
    "model": {"depth": 10, "width": 1,
              "posterior": {"method": "rank1", "ensemble_size": 2, "random_sign_init": -0.5}},
    "train": {"batch_size": 32, "max_steps": 200, "optimizer": "adam", "learning_rate": 0.003,
              "kl_annealing_epochs": 4, "checkpoint_every_steps": 100, "log_every_steps": 50},
    "eval": {"num_samples": 2, "batch_size": 500},
}
