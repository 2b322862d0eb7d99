"""A software-engineering environment: fix the seeded bug of a generated repository with tools.

Host code. `SweEnv` is one episode on one `data.swe_repos` repository (an `Example` whose
`hidden` holds the files, the allowed paths and the hidden tests). The prompt is the bug report
under a system message that lists the tools in the Qwen tool-call format:

* `list_files(path="")`: the repository's files (under `path`);
* `read_file(path)`: one file's text;
* `run(command)`: a command in the sandbox (`python run_tests.py`, `python -c ...`, `ls`,
  `grep ...`; no shell), on a throwaway copy of the workspace: what it writes is deleted with
  its sandbox;
* `edit_file(path, old, new)`: replaces the one occurrence of `old` in an allowed file;
* `write_file(path, content)`: replaces an allowed file's text.

A turn without a tool call ends the episode. The agent's patch is the allowed files that
differ from the pristine repository; `SweTask.score` runs the hidden tests on a fresh pristine
copy with the patch applied (`swe_tools.score_patch`) and again on a copy regenerated from the
seed (the replay): parts "correct" (every hidden test passed, in both runs) and "tests_passed"
(the fraction, the lower of the two).

Anti-cheat record, per episode (`SweEnv.flags`) and summed in `SweTask.stats()` as
`swe/flag_<name>` (episodes flagged): "outside_allowed" (an edit or write of a file other than
the package's source, refused), "test_tamper" (an edit, write or command aimed at the tests or at
the evaluator's hooks: conftest.py, sitecustomize.py, .pth), "probe" (paths outside the
repository, /proc, the environment variables, network modules), "short" (an episode that
ended with fewer than `min_tool_calls` tool calls), "replay_mismatch" (the replay scored
differently), "state_mismatch" (the workspace at reset does not hash to the recorded value).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Sequence

import numpy as np

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import swe_repos
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs import swe_tools
from rlvr_jax.envs.environment import TOOL_CALL_CLOSE, ToolCallError, ToolEnvironment
from rlvr_jax.envs.task import MultiTurnTask
from rlvr_jax.rewards import sandbox
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import Rollout

FLAGS = (
    "outside_allowed",
    "test_tamper",
    "probe",
    "short",
    "replay_mismatch",
    "state_mismatch",
)
LIMITS = sandbox.SandboxLimits(
    cpu_seconds=5, wall_seconds=10.0, memory_bytes=512 << 20, max_output_bytes=64 << 10
)


def _tool(name: str, description: str, **params: str) -> str:
    return json.dumps(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        p: {"type": "string", "description": d} for p, d in params.items()
                    },
                    "required": [p for p in params if p != "path" or name != "list_files"],
                },
            },
        }
    )


TOOLS = "\n".join(
    [
        _tool("list_files", "Lists the repository's files.", path="a directory (optional)"),
        _tool("read_file", "Returns a file's text.", path="the file"),
        _tool(
            "run",
            "Runs a command in a sandbox on a copy of the repository (changes are discarded).",
            command="e.g. python run_tests.py",
        ),
        _tool(
            "edit_file",
            "Replaces the one occurrence of old by new in a source file.",
            path="the file",
            old="the exact text to replace",
            new="its replacement",
        ),
        _tool("write_file", "Replaces a source file's text.", path="the file", content="text"),
    ]
)
SYSTEM = (
    "You are a software engineer. Fix the bug described by the user in the repository, using "
    "the tools.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
    f"<tools>\n{TOOLS}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclasses.dataclass(frozen=True)
class SweOptions:
    """Attributes:
    limits: the sandbox limits of each command and of each scoring run.
    backend: the sandbox backend of the commands and the scoring runs: "bwrap", or "rlimits"
      for trusted code and tests only (`reward.sandbox_backend`).
    max_output_chars: tool outputs are cut past it.
    min_tool_calls: an episode that ends with fewer is flagged "short".
    replay: score each patch a second time on a copy regenerated from the seed.
    """

    limits: sandbox.SandboxLimits = LIMITS
    backend: str = "bwrap"
    max_output_chars: int = 2000
    min_tool_calls: int = 2
    replay: bool = True


class SweEnv(ToolEnvironment):
    """One episode on one generated repository (see the module docstring)."""

    def __init__(self, tok: Tokenizer, options: SweOptions = SweOptions(), system: str = SYSTEM):
        super().__init__()
        self.tok, self.options, self.system = tok, options, system
        self.files: dict[str, str] = {}
        self.pristine: dict[str, str] = {}
        self.allowed: frozenset[str] = frozenset()
        self.initial_hash = ""
        self.flags: Counter[str] = Counter()
        self.tools = {
            "list_files": self.list_files,
            "read_file": self.read_file,
            "run": self.run,
            "edit_file": self.edit_file,
            "write_file": self.write_file,
        }

    def reset(self, example: Example) -> str:
        hidden = example.hidden
        self.pristine = dict(hidden["files"])
        self.files = dict(self.pristine)  # this episode's own copy
        self.allowed = frozenset(hidden["allowed"])
        self.flags = Counter()
        self.initial_hash = swe_repos.repo_hash(self.files)
        if self.initial_hash != hidden.get("repo_hash"):
            self.flags["state_mismatch"] += 1
        return super().reset(example)

    def prompt(self, example: Example) -> str:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": example.prompt_text},
        ]
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def answer_parts(self, text: str) -> dict[str, float]:
        del text  # the patch is scored by the task, from `patch()`
        return {"correct": 0.0}

    def _path(self, path) -> str:
        try:
            return swe_tools.repo_path(path)
        except ToolCallError:
            self.flags["probe"] += isinstance(path, str)
            raise

    def list_files(self, path: str = "") -> str:
        root = self._path(path)
        prefix = root + "/" if root else ""
        names = sorted(p for p in self.files if p.startswith(prefix))
        return "\n".join(names) if names else f"Error: no files under {path!r}"

    def read_file(self, path: str) -> tuple[str, bool]:
        name = self._path(path)
        if name not in self.files:
            return f"Error: no file {path!r}", True
        text = self.files[name]
        limit = self.options.max_output_chars
        if len(text) > limit:
            text = text[:limit] + f"\n[cut at {limit} characters]"
        return text, False

    def _writable(self, path) -> str:
        name = self._path(path)
        if name not in self.allowed:
            self.flags["outside_allowed"] += 1
            if swe_tools.is_test_file(name):
                self.flags["test_tamper"] += 1
            raise ToolCallError(
                f"{name!r} may not be changed; allowed: {', '.join(sorted(self.allowed))}"
            )
        return name

    def edit_file(self, path: str, old: str, new: str) -> str:
        name = self._writable(path)
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise ToolCallError('"old" (non-empty) and "new" must be strings')
        count = self.files[name].count(old)
        if count != 1:
            raise ToolCallError(f"{name!r} holds {count} occurrences of old; it needs exactly 1")
        self.files[name] = self.files[name].replace(old, new)
        return f"edited {name}"

    def write_file(self, path: str, content: str) -> str:
        name = self._writable(path)
        if not isinstance(content, str):
            raise ToolCallError('"content" must be a string')
        self.files[name] = content
        return f"wrote {name} ({len(content)} characters)"

    def run(self, command: str) -> tuple[str, bool]:
        if isinstance(command, str):
            if swe_tools.probe_reasons(command):
                self.flags["probe"] += 1
            if swe_tools.tamper_reasons(command):
                self.flags["test_tamper"] += 1
        o = self.options
        return swe_tools.run_command(command, self.files, o.limits, o.backend, o.max_output_chars)

    def patch(self) -> dict[str, str]:
        """The allowed files that differ from the pristine repository: path -> text."""
        return {p: self.files[p] for p in sorted(self.allowed) if self.files[p] != self.pristine[p]}

    def episode_flags(self) -> dict[str, int]:
        """Per flag, 1 when this episode raised it (`short` included)."""
        flags = {name: int(self.flags[name] > 0) for name in FLAGS}
        flags["short"] = int(self.tool_calls < self.options.min_tool_calls)
        return flags


def evaluate_patch(
    example: Example, patch: dict[str, str], options: SweOptions
) -> tuple[float, float, bool]:
    """(correct, fraction passed, replay mismatch) of a patch on the example's repository.

    The first run applies the patch to the example's pristine files; the replay serialises the
    patch, regenerates the repository from its seed (`data.swe_repos`) and runs again in a new
    sandbox. A mismatch (a verdict that depends on time, chance or the host, or an example
    whose files are not its seed's) scores the lower of the two and is reported.
    """
    hidden = example.hidden
    tests = swe_repos.hidden_from_json(hidden["hidden_tests"])
    package = hidden["allowed"][0].split("/")[0]
    o = options
    first = swe_tools.score_patch(hidden["files"], patch, tests, package, o.limits, o.backend)
    results = [first]
    if o.replay:
        seed, index = example.meta["seed"], example.meta["index"]
        again = swe_repos.swe_repo(seed, index)
        recorded = json.loads(json.dumps(patch))
        results.append(
            swe_tools.score_patch(
                again.files, recorded, again.hidden_tests, package, o.limits, o.backend
            )
        )
    fractions = [sum(r) / len(r) if r else 0.0 for r in results]
    correct = all(bool(r) and all(r) for r in results)
    mismatch = len({tuple(r) for r in results}) > 1
    return float(correct), min(fractions), mismatch


class SweTask(MultiTurnTask):
    """`reward.verifier="swe"`: episodes of `SweEnv` (`data.name="swe_repos"`), each patch
    scored by the hidden tests (and their replay) in the task's thread pool; commands and scoring
    run in `reward.sandbox_backend` (unless `options` are given).

    `score` pairs the rows of a rollout with the episodes this task created last (one per row,
    in order, as `rl.multiturn` creates them just before), checking that each episode's example
    is its row's; a row without its episode scores 0 and counts as "swe/unmatched".
    """

    name = "swe"

    def __init__(self, tok: Tokenizer, reward: RewardSettings, options: SweOptions | None = None):
        self.tok = tok
        self.options = options or SweOptions(backend=reward.sandbox_backend)
        self.sandbox_backend = self.options.backend
        self.max_turns = reward.max_turns
        self.turn_tokens = reward.turn_tokens
        self.tool_workers = reward.tool_workers
        self.overlap_tools = reward.overlap_tools
        self.stop_sequences = (tuple(tok.encode(TOOL_CALL_CLOSE)),)
        self._created: list[SweEnv] = []
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=reward.workers, thread_name_prefix="swe-score"
        )

    @classmethod
    def build(cls, tok: Tokenizer, reward: RewardSettings, examples: Sequence[Example]) -> SweTask:
        """The task for `examples`, which must all be generated repositories.

        Raises:
          ConfigError: naming the first example that is not one.
        """
        bad = next((ex for ex in examples if "hidden_tests" not in ex.hidden), None)
        if bad is not None:
            raise ConfigError(
                f"reward.verifier='swe' needs generated repositories; {bad.id!r} is not one "
                "(use data.name='swe_repos')"
            )
        return cls(tok, reward)

    def environment(self) -> SweEnv:
        env = SweEnv(self.tok, self.options)
        with self._lock:
            self._created.append(env)
        return env

    def _score_one(self, env: SweEnv | None, example: Example) -> tuple[float, float]:
        if env is None or env.example is None or env.example.id != example.id:
            with self._lock:
                self.counts["unmatched"] += 1
            return 0.0, 0.0
        correct, fraction, mismatch = evaluate_patch(example, env.patch(), self.options)
        flags = env.episode_flags()
        flags["replay_mismatch"] = int(mismatch)
        with self._lock:
            self.counts["episodes"] += 1
            self.counts["correct"] += int(correct)
            for name, value in flags.items():
                self.counts[f"flag_{name}"] += value
        return correct, fraction

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        N = len(examples_N)
        with self._lock:
            envs = self._created[-N:] if len(self._created) >= N else []
            self._created.clear()
        envs = envs or [None] * N
        futures = [
            self._executor.submit(self._score_one, env, ex)
            for env, ex in zip(envs, examples_N, strict=True)
        ]
        results = [f.result() for f in futures]
        return {
            "correct": np.asarray([r[0] for r in results], np.float32),
            "tests_passed": np.asarray([r[1] for r in results], np.float32),
        }

    def stats(self) -> dict[str, float]:
        with self._lock:
            counts = dict(self.counts)
        names = ["episodes", "correct", "unmatched", *(f"flag_{f}" for f in FLAGS)]
        return {f"swe/{k}": float(counts.get(k, 0)) for k in names}

    def close(self) -> None:
        self._executor.shutdown(wait=True)
