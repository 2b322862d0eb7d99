"""What a stage is built from, given its settings: the mesh, model, optimizer, train state, task
and sampler (`build`), and the reward models a task may score with (`learned_rewards`). It may
import `program.settings` and `program.runtime` (to restore weights from a checkpoint).
"""
