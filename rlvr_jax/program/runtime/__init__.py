"""The run skeleton every stage shares: the step loop and its resume (`run`), checkpoints
(`checkpoint`, with its on-disk `checkpoint_layout` and save `checkpoint_threads`), the metrics
ledger (`metrics`, `ledger`, `event_files`), stop signals (`preemption`), the persistent compile
cache and start-up record (`compilation`), the workdir lock (`workdir_lock`), the config file's
guard (`config_file`) and the entry points' error exit (`user_errors`). It knows no model, task
or stage: it imports `program.settings` and the layers below `program` only.
"""
