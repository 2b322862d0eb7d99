"""Supervised fine-tuning: demonstrations (`data`) and the update (`step`)."""

from rlvr_jax.sft.data import (
    FIELD_PAIRS,
    Demonstration,
    EncodedDemonstrations,
    demonstrations_from_examples,
    encode_demonstrations,
    load_demonstrations,
)
from rlvr_jax.sft.step import SFTBatch, build_sft_step, make_batch, sft_loss

__all__ = [
    "FIELD_PAIRS",
    "Demonstration",
    "EncodedDemonstrations",
    "SFTBatch",
    "build_sft_step",
    "demonstrations_from_examples",
    "encode_demonstrations",
    "load_demonstrations",
    "make_batch",
    "sft_loss",
]
