"""Studies that run several stages and compare them: ablations over variants and seeds
(`ablation`), stage pipelines with an evaluation of every stage (`pipeline`, `pipeline_eval`),
rejection sampling (`rejection`) and the offline difficulty filter (`difficulty`). A study runs
stages only through `stages.dispatch` and may import everything in `program` below it.
"""
