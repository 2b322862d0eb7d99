"""Held-out evaluation of a policy: sampling and scoring an evaluation set (`evaluation`), the
metrics of its groups and sources (`eval_metrics`), accuracy under thinking budgets
(`thinking_budget`) and the plots of a run's ledger (`plots`). It may import `program.settings`,
`program.runtime` and `program.parts`; the stages evaluate with it, never the other way round.
"""
