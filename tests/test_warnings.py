"""Commands start without transformers' "PyTorch was not found" notice, and keep its other warnings.

The test environment has torch (the parity tests need it), and transformers only prints the notice
when torch is missing; each subprocess hides torch first (`sys.modules["torch"] = None` makes
`importlib.util.find_spec` and `import torch` fail as on a machine without it), so the assertions
could fail.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTICE = "PyTorch was not found"
HIDE_TORCH = "import sys; sys.modules['torch'] = None\n"


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", HIDE_TORCH + code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_training_command_starts_without_the_pytorch_notice(tmp_path):
    run_main = (
        "import runpy; runpy.run_module('rlvr_jax.main', run_name='__main__', alter_sys=True)"
    )
    proc = _python(
        run_main,
        "--config=configs/tiny.py",
        f"--workdir={tmp_path}",
        # No update: the run still builds its tokenizer (where transformers is imported), loads
        # its data and evaluates, at a fraction of a step's compile time.
        "--config.train.steps=0",
        "--config.data.num_eval=4",
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout
    assert "PyTorch" not in proc.stderr


def test_only_the_pytorch_notice_is_dropped():
    code = """
from rlvr_jax.data.tokenizer import Tokenizer
Tokenizer.from_characters("0123456789")  # imports transformers
import transformers
from transformers.utils import logging
assert "transformers" in sys.modules and not transformers.is_torch_available()
logging.get_logger("transformers").warning("a warning that must still show")
logging.get_logger("transformers.tokenization_utils_base").warning("and one from a submodule")
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert NOTICE not in proc.stderr
    assert "a warning that must still show" in proc.stderr
    assert "and one from a submodule" in proc.stderr


def test_the_notice_shows_without_the_filter():
    # The same import, without rlvr_jax: proves the hidden-torch setup triggers the notice, so
    # its absence above is the filter's doing.
    proc = _python("import transformers")
    assert proc.returncode == 0, proc.stderr
    assert NOTICE in proc.stderr
