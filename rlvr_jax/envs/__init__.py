"""Tasks and environments: the one interface between verifiers and the training loop."""
