"""Rejection-sampled demonstrations: a policy's own verified answers, for another SFT stage.

DeepSeek-R1's third stage samples several answers per training prompt from the RL checkpoint,
keeps those the verifier accepts (and, where the task checks a format, that are well formed) and
fine-tunes on them. `sample_demonstrations` does that with
the KV-cache sampler and the task interface (in-graph or pool verifiers alike) and writes the
kept answers as the SFT stage's JSONL ({"prompt", "response", "answer", "id", "source"} a line),
which `sft.path` reads.

Qwen3's thinking-mode fusion draws its thinking rows the same way: `thinking_switch` samples
each prompt in thinking mode, as the fusion row will put it (the "/think" flag after the
question, or the chat template's `enable_thinking=True`), and `sft.traces.traces_from_samples`
turns the kept answers into the rows' thoughts.

Host code: generation is `generate_in_batches`, verification `Task.score`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlvr_jax.data import modes, templates
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.program.parts import build
from rlvr_jax.program.settings import Settings
from rlvr_jax.program.studies.pipeline_eval import response_text
from rlvr_jax.sampling.config import sampling_params
from rlvr_jax.sampling.host import completions, generate_in_batches
from rlvr_jax.types import Rollout


@dataclasses.dataclass(frozen=True)
class RejectionReport:
    """What a rejection-sampling pass kept.

    Attributes:
      prompts: training prompts sampled.
      samples: answers generated (prompts x n).
      correct: answers the verifier accepted (correct and, where checked, well formed).
      kept: distinct accepted answers written (a prompt's duplicates are written once).
      prompts_kept: prompts with at least one accepted answer.
    """

    prompts: int
    samples: int
    correct: int
    kept: int
    prompts_kept: int

    def summary(self) -> str:
        """One line for the log."""
        return (
            f"rejection sampling: {self.correct} of {self.samples} answers verified on "
            f"{self.prompts} prompts; kept {self.kept} distinct answers of {self.prompts_kept} "
            "prompts"
        )


def sample_demonstrations(
    settings: Settings,
    num_samples: int,
    out: str | Path,
    temperature: float = 1.0,
    log: Callable[[str], None] = print,
    thinking_switch: str | None = None,
) -> RejectionReport:
    """Samples `num_samples` answers per training prompt of `settings.data` from the weights at
    `settings.model.source`, and writes the verified ones (correct, and well formed where the
    task has a "format" part) to `out` as SFT demonstrations.

    The prompts, template, verifier and generation length are the settings'; the sampling seed
    is `train.seed`. The file is written whole to a temporary name and renamed, so a rerun never
    reads a half-written one.

    `thinking_switch` ("flag" or "enable_thinking", as `data.modes`' switches) samples every
    prompt in thinking mode: the question followed by the "/think" flag, or the chat template
    with `enable_thinking=True`. A row's "id" is then its example's id, "/rs" and an index.

    Raises:
      ValueError: `num_samples` < 1, an unknown `thinking_switch`, "enable_thinking" with a
        template that is not a chat template (`data.modes.ask_in_modes`, `PromptTemplate`), or
        no answer was verified (an SFT stage needs at least one).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    if thinking_switch and settings.data.modes:
        raise ValueError(
            f"thinking_switch={thinking_switch!r} with data.modes={settings.data.modes!r}: the "
            "prompts would be asked in two modes at once"
        )
    tok, params, model_cfg, s = build.policy_and_settings(settings)
    train_ex = build.load_examples(s.data)[0]
    template = templates.get_template(s.data.template)
    if thinking_switch:  # every prompt asked in thinking mode, as `data.modes` asks them
        train_ex = modes.ask_in_modes(train_ex, thinking_switch, think_share=1.0)
    enc = templates.encode_prompts(train_ex, template, tok, s.data.buckets)
    cfg = dataclasses.replace(s.rl.sampler, method="sample")
    B, G = s.eval.batch_prompts, num_samples
    with build_task(s.reward, tok, model_cfg.vocab_size, enc.examples, s.data.template) as task:

        def score(rollout: Rollout, prompt_ids: list[int]):
            rows = [enc.examples[j] for j in prompt_ids for _ in range(G)]
            texts = [response_text(t, tok) for t in completions(rollout)]
            parts = task.score(rollout, rows)
            # As in R1, a kept answer is right and, where the task checks a format, well formed.
            ok = np.asarray(parts["correct"]) > 0.5
            if "format" in parts:
                ok &= np.asarray(parts["format"]) > 0.5
            return ok, np.asarray(texts, dtype=object)

        correct, texts = generate_in_batches(
            params,
            enc.ids,
            score,
            model_cfg=model_cfg,
            cfg=cfg,
            batch_prompts=B,
            buckets=s.data.buckets,
            pad_id=tok.pad_id,
            group_size=G,
            sp=sampling_params(B * G, temperature, 1.0),
            seed=s.train.seed,
        )
    correct_BG, texts_BG = correct.reshape(-1, G), texts.reshape(-1, G)
    lines, prompts_kept = [], 0
    for ex, ok_G, text_G in zip(enc.examples, correct_BG, texts_BG, strict=True):
        kept = list(dict.fromkeys(str(t) for t, ok in zip(text_G, ok_G, strict=True) if ok))
        prompts_kept += bool(kept)
        for i, text in enumerate(kept):
            row = {
                "id": f"{ex.id}/rs{i}",
                "prompt": ex.prompt_text,
                "response": text,
                "answer": ex.answer,
                "source": ex.source,
            }
            lines.append(json.dumps(row))
    report = RejectionReport(
        len(enc.ids), int(correct_BG.size), int(correct_BG.sum()), len(lines), prompts_kept
    )
    log(report.summary())
    if not lines:
        raise ValueError(f"{report.summary()}: nothing to fine-tune on")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    return report
