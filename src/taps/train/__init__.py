"""Training: the DFlash drafter recipe (drafter.py)."""

from taps.train.drafter import TrainDrafterConfig, TrainResult, train_drafter

__all__ = ["TrainDrafterConfig", "TrainResult", "train_drafter"]
