"""The program layer: what turns settings into a trained, evaluated, saved policy.

`settings` (the typed config every entry point reads) sits at the bottom; above it, in order, each
sub-package importing only from those below it (tests/test_layers.py checks): `runtime` (the run
skeleton every stage shares), `parts` (the model, optimizer, task and reward models a stage is
built from), `evals` (held-out evaluation and its plots), `stages` (RL, SFT, reward model) and
`studies` (ablations, stage pipelines, rejection sampling, the difficulty filter).
"""
