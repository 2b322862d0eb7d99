"""Scripted gold episodes of a multi-turn task, as token rows for a supervised cold start.

A model that has never seen the tool-call format does not call tools, so RL has no successful
episode to reinforce; a short SFT stage on gold episodes starts it (R1's cold start, for tools).
`MultiTurnTask.demonstration(example)` gives an environment and a scripted policy (for
`math_tool`: call `python` with the problem's expression, then box what it printed);
`play_episode` plays it through the environment, so the observations are the real tools'
outputs, and lays the tokens out exactly as `rl.multiturn.run_episodes` does: the prompt, each
model turn encoded on its own (the last one followed by the tokenizer's first end id) and each
observation wrapped by the task's `ToolResponseFormat`. Model turns are trained on, the prompt and
the observations are context. An episode that the environment does not score correct is dropped
and counted.

Host code; no JAX.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import Demonstrator, ToolResponseFormat
from rlvr_jax.envs.task import MultiTurnTask


@dataclasses.dataclass(frozen=True)
class EpisodeTokens:
    """One played episode.

    Attributes:
      example_id: the example's id.
      ids: prompt, model turns and observations, the last turn followed by an end id.
      trained: per id, True for the model's tokens (the loss's targets).
      prompt_length: how many ids the prompt has.
      parts: the environment's reward parts after the last turn.
    """

    example_id: str
    ids: list[int]
    trained: list[bool]
    prompt_length: int
    parts: dict[str, float]


def play_episode(
    demonstrator: Demonstrator,
    example: Example,
    tok: Tokenizer,
    response_format: ToolResponseFormat,
    max_turns: int,
) -> EpisodeTokens:
    """Plays the scripted policy through its environment for at most `max_turns` turns.

    Raises:
      ValueError: when the episode has not ended after `max_turns` turns.
    """
    env, policy = demonstrator
    prompt = tok.encode(env.reset(example))
    ids, trained = list(prompt), [False] * len(prompt)
    observation = None
    for _ in range(max_turns):
        turn = policy(observation)
        result = env.step(turn)
        turn_ids = tok.encode(turn)
        if result.done:
            turn_ids.append(tok.eos_ids[0])
        ids += turn_ids
        trained += [True] * len(turn_ids)
        if result.done:
            return EpisodeTokens(example.id, ids, trained, len(prompt), dict(result.parts))
        observation = result.observation
        obs = tok.encode(response_format.wrap(observation))
        ids += obs
        trained += [False] * len(obs)
    raise ValueError(f"the scripted episode of {example.id!r} did not end in {max_turns} turns")


@dataclasses.dataclass(frozen=True)
class Demonstrations:
    """The kept episodes and what was dropped.

    Attributes:
      episodes: correct episodes that fit, in example order.
      no_script: examples the task has no script for.
      not_correct: episodes the environment did not score correct (a tool failed, say).
      too_long: episodes longer than the limit.
    """

    episodes: list[EpisodeTokens]
    no_script: int
    not_correct: int
    too_long: int

    def summary(self) -> str:
        """One line for the log."""
        trained = sum(sum(e.trained) for e in self.episodes)
        return (
            f"{len(self.episodes)} scripted tool episodes ({trained} model tokens); skipped "
            f"{self.no_script} without a script, {self.not_correct} not scored correct, "
            f"{self.too_long} too long"
        )


def scripted_demonstrations(
    task: MultiTurnTask,
    examples: Sequence[Example],
    max_len: int,
    workers: int = 8,
) -> Demonstrations:
    """Plays `task.demonstration(ex)` for every example, `workers` at a time (tools are slow),
    keeping the episodes scored correct ("correct" part 1) with at most `max_len` ids."""
    scripted = [(ex, task.demonstration(ex)) for ex in examples]
    playable = [(ex, d) for ex, d in scripted if d is not None]

    def play(item):
        ex, d = item
        return play_episode(d, ex, task.tok, task.response_format, max(task.max_turns, 1))

    with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
        played = list(pool.map(play, playable))
    correct = [e for e in played if e.parts.get("correct", 0.0) >= 1.0]
    fits = [e for e in correct if len(e.ids) <= max_len]
    return Demonstrations(
        fits,
        no_script=len(scripted) - len(playable),
        not_correct=len(played) - len(correct),
        too_long=len(correct) - len(fits),
    )
