"""The program layer: settings, the run skeleton, checkpoints, metrics and evaluation."""
