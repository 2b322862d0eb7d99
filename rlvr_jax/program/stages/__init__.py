"""The training stages, each one `run(settings, workdir)` on the shared skeleton: RL
(`rl_stage`: rollout, reward, update), supervised fine-tuning (`sft_stage`) and a reward model on
preference pairs (`rm_stage`); `dispatch.run` picks one from `train.stage`. A stage may import
`program.settings`, `runtime`, `parts` and `evals`.
"""
