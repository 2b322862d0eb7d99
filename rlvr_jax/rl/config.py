"""The RL algorithm's static settings: group size, passes, minibatches, sampling, loss."""

from __future__ import annotations

import dataclasses
from typing import Literal

from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl import losses
from rlvr_jax.rl.value import CriticConfig
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.continuous import auto_slots


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """The RL algorithm's static settings.

    Attributes:
      group_size: G samples per prompt.
      mu: passes over each rollout batch (GRPO's mu; 1 is on-policy).
      num_minibatches: optimizer updates per pass; the N rows are shuffled and split evenly.
      num_microbatches: gradient-accumulation chunks per minibatch (memory only: the result is
        the same as one chunk, in every aggregation mode). "auto": before the first step the
        program compiles the step on abstract shapes for each candidate count and keeps the
        fewest whose memory fits the device (`rl.memory`); `resolved` replaces it by a number.
      memory_budget_gib: the per-device memory "auto" (here and in `mesh.seq`) may fill; 0
        uses the limit the device reports (GPU, TPU), which a CPU does not, so there it must be
        set.
      temperature, top_p, min_p: sampling values; log-probs for the loss use the same
        temperature so that ratios compare like with like.
      logprob_chunk: time steps per chunk of the log-prob computation (vocab-sized logits of only
        this many steps exist at once).
      mask_truncated: leave rows that hit `max_new_tokens` out of the loss (DAPO's overlong
        filtering); they still count in the group baselines.
      group_grad_norms: also log each prompt's share of the gradient: the global norm of the
        gradient of its G rows' terms of the full-batch loss (the batch's normaliser) at the
        pre-update parameters, as "groups/grad_norm" (B,), with its success rate
        "groups/success_rate" (B,). One extra backward pass per group (a diagnostic; the std
        scaling's re-weighting of prompts shows in it).
      shared_prompt_forward: run each group's prompt once instead of G times, in the rollout's
        prefill (`SamplerConfig.prompt_group`) and in the update's forwards
        (`grouped.grouped_hidden_states`); the same numbers. In the update it applies where a
        forward sees whole groups in order: always for the old and reference log-probs; for the
        policy loss when there is one minibatch (minibatches shuffle rows, not groups) and each
        microbatch holds whole groups.
      decode_slots: rows decoded at once in the rollout (continuous batching,
        `generate_continuous`): when a row ends its slot takes the next queued row, so
        short answers do not wait for the longest. A number in [1, N], N being the static
        sampler; "auto" takes `auto_slots`: N / 4 slots for answers of 1,024 tokens
        or more (where the long tail dominates), the static sampler below that. The tokens are
        the same either way (each row has its own random stream).
      partial_budget: Kimi k1.5's partial rollouts (`rl.partial`): 0 is off; otherwise each step
        runs rounds in which every row decodes at most this many more tokens, a row that has not
        ended carries over to the next round or step, and the step trains on the first B
        groups whose rows have all ended. Tokens an older policy sampled are corrected by
        `loss.tis_cap`, which must be set; the think budget is refused.
      pack: the packed update (`rl.packing`): the step's rows packed by their real lengths
        into a packed row per row shard and microbatch, each group's prompt once, so that the
        update's forwards and backward skip the padding; the numbers are the padded update's
        to float noise. It runs the rollout and the update as two programs (the packing is
        planned on the host between them) and compiles one update per packed shape its steps
        reach (`packing.length_buckets`). With several minibatches each is packed alone, in the
        order the update shuffles the rows (`packing.plan_minibatches`). A step whose rows are
        too even for packing to pay runs the padded update (`packing.worth_packing`). "auto"
        (the default): packed where the step is already two programs (a host verifier, dynamic
        sampling, partial rollouts, tools); True also splits a fused step.
      pack_length: tokens per packed row, with bucketed row counts (`packing.row_buckets`);
        0: one packed row per row shard and microbatch, its length chosen per step
        (`packing.length_buckets`: multiples of `model.attention_block`, at most a sixteenth
        over the step's tokens).
      pack_microbatch_tokens: the token budget of one packed microbatch; the packed rows go to
        the fewest microbatches within it. 0: the padded microbatch's (its rows times the
        padded length; with `num_microbatches="auto"`, the count the memory search kept).
      advantage: the advantage estimator.
      loss: the policy objective.
      critic: PPO's value model (`rl.value`); needed by, and only by, the "gae" estimator.
      sampler: static sampler settings (max_new_tokens, eos ids, stops, top_k, think budget).
    """

    group_size: int
    sampler: SamplerConfig
    advantage: adv_lib.AdvantageConfig = adv_lib.AdvantageConfig()
    loss: losses.LossConfig = losses.LossConfig()
    critic: CriticConfig = CriticConfig()
    mu: int = 1
    num_minibatches: int = 1
    num_microbatches: int | Literal["auto"] = 1
    memory_budget_gib: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.0
    logprob_chunk: int = 256
    mask_truncated: bool = False
    group_grad_norms: bool = False
    shared_prompt_forward: bool = True
    decode_slots: int | Literal["auto"] = "auto"
    partial_budget: int = 0
    pack: bool | Literal["auto"] = "auto"
    pack_length: int = 0
    pack_microbatch_tokens: int = 0

    def __post_init__(self):
        for name in ("group_size", "mu", "num_minibatches", "num_microbatches", "logprob_chunk"):
            value = getattr(self, name)
            if name == "num_microbatches" and value == "auto":
                continue
            if isinstance(value, str) or value < 1:
                raise ValueError(f"rl.{name}={value!r} must be at least 1")
        if self.decode_slots != "auto" and (
            isinstance(self.decode_slots, str) or self.decode_slots < 1
        ):
            raise ValueError(f'rl.decode_slots={self.decode_slots!r} must be >= 1 or "auto"')
        if self.partial_budget:
            self._check_partial()
        for name in ("pack_length", "pack_microbatch_tokens"):
            value = getattr(self, name)
            if isinstance(value, str) or value < 0:
                raise ValueError(f"rl.{name}={value!r} must be >= 0 (0: the default)")
        if self.pack not in (True, False, "auto"):
            raise ValueError(f'rl.pack={self.pack!r} must be True, False or "auto"')
        if not self.memory_budget_gib >= 0:
            raise ValueError(f"rl.memory_budget_gib={self.memory_budget_gib} must be >= 0")
        if self.advantage.estimator == "pass_at_k" and self.advantage.pass_k > self.group_size:
            raise ValueError(
                f"rl.advantage.pass_k={self.advantage.pass_k} exceeds rl.group_size="
                f"{self.group_size}: pass@k draws its k tries from the group's samples"
            )
        if self.group_size < 2 and self.advantage.estimator in ("grpo", "dr_grpo", "rloo"):
            raise ValueError(
                f"rl.group_size={self.group_size} with advantage estimator "
                f"{self.advantage.estimator!r}: a group baseline needs at least 2 samples"
            )
        gae = self.advantage.estimator == "gae"
        if gae != self.critic.enabled:
            raise ValueError(
                f"rl.advantage.estimator={self.advantage.estimator!r} with rl.critic.kind="
                f"{self.critic.kind!r}: GAE needs a value model and only GAE uses one (set both "
                "estimator='gae' and kind='head' or 'model', or neither)"
            )
        if not self.temperature > 0:
            raise ValueError(f"rl.temperature={self.temperature} must be positive")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rl.top_p={self.top_p} must be in (0, 1]")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"rl.min_p={self.min_p} must be in [0, 1)")
        if self.advantage.estimator == "expert_iteration" and self.loss.policy_loss != "reinforce":
            raise ValueError(
                f"rl.loss.policy_loss={self.loss.policy_loss!r} with rl.advantage.estimator="
                "'expert_iteration': expert iteration is SFT on verified samples, set "
                "rl.loss.policy_loss='reinforce'"
            )

    def packs(self) -> bool:
        """Whether a two-program step packs its update's rows (`pack`)."""
        return self.pack in (True, "auto")

    def _check_partial(self) -> None:
        budget = self.partial_budget
        if isinstance(budget, str) or budget < 0:
            raise ValueError(f"rl.partial_budget={budget!r} must be >= 0 (0 turns it off)")
        if self.loss.tis_cap is None:
            raise ValueError(
                f"rl.partial_budget={budget} trains on tokens that older policies sampled; set "
                "rl.loss.tis_cap (e.g. 2.0) so that their loss is importance-weighted"
            )
        if self.sampler.think_budget:
            raise ValueError(
                f"rl.partial_budget={budget} with rl.sampler.think_budget="
                f"{self.sampler.think_budget}: a resumed row's thinking count would restart"
            )

    def slots_for(self, num_rows: int) -> int:
        """The rollout's decode slots for `num_rows` rows (see `decode_slots`)."""
        if self.decode_slots == "auto":
            return auto_slots(num_rows, self.sampler.max_new_tokens)
        if self.decode_slots > num_rows:
            raise ValueError(f"rl.decode_slots={self.decode_slots} exceeds the {num_rows} rows")
        return self.decode_slots

    @property
    def auto_microbatches(self) -> bool:
        """Whether `num_microbatches` is still "auto" (see `rl.memory.fewest_microbatches`)."""
        return self.num_microbatches == "auto"

    @property
    def on_policy(self) -> bool:
        """One update per rollout: old log-probs equal the current ones (no extra forward)."""
        return self.mu * self.num_minibatches == 1

    def microbatches_hold_groups(self, num_rows: int) -> bool:
        """Whether each microbatch of the policy loss holds whole groups in order: rows are not
        shuffled (one minibatch) and a microbatch is a whole number of groups."""
        micro_rows = num_rows // (self.num_minibatches * self.microbatch_count())
        return self.num_minibatches == 1 and micro_rows % self.group_size == 0

    def check_rows(self, num_rows: int) -> None:
        """Raises ValueError unless N rows split into the configured minibatches/microbatches."""
        micro = 1 if self.auto_microbatches else self.num_microbatches
        chunks = self.num_minibatches * micro
        if num_rows % self.group_size or num_rows % chunks:
            raise ValueError(
                f"{num_rows} rows do not split into groups of {self.group_size} and "
                f"{self.num_minibatches} minibatches x {micro} microbatches"
            )

    def microbatch_count(self) -> int:
        """`num_microbatches` as a number; raises ValueError while it is still "auto"."""
        if self.auto_microbatches:
            raise ValueError(
                'rl.num_microbatches="auto" must be resolved to a number before the step is '
                "built (rl.memory.fewest_microbatches)"
            )
        return self.num_microbatches
