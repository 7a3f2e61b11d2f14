"""What the training tests build: a toy SFT dataset, a training profile and recipe, the CLI as
a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl

from tests.support.paths import ROOT
from tests.support.profiles import toml_profile

MSG = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))


def sft_parquet(path: Path, n: int = 48, n_eval: int = 8) -> Path:
    """A learnable toy task: every question about the code word has the same answer."""
    rows = [{"messages": [{"role": "user", "content": f"Question {i}: what is the code word?"},
                          {"role": "assistant", "content": "The code word is pineapple."}],
             "split": "eval" if i < n_eval else "train"} for i in range(n)]
    pl.DataFrame(rows, schema={"messages": MSG, "split": pl.String}).write_parquet(path)
    return path


def train_profile(tmp: Path, model_cache: Path, margin: float = 0.0, recipe: Path | None = None
                  ) -> Path:
    recipe = recipe or write_recipe(tmp)
    # one thread for training's export check (torch and llama.cpp): the test workers share the
    # cores, and 2 threads spinning against each other cost test_flow_trains_exports_verifies_...
    # 164 s of CPU against 140 s with 1, with two other cores' worth of work running
    return toml_profile(tmp / "train.toml", state_dir=tmp / "state",
                        compute={"type": "local", "n_threads": 1},
                        graph={"type": "falkordb", "data_dir": tmp / "graph"},
                        training={"recipe": recipe, "model_cache": model_cache,
                                  "promote_margin": margin})


def write_recipe(tmp: Path, **over: Any) -> Path:
    base = {"peft": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
            "activation_checkpointing": False, "per_device_train_batch_size": 2,
            "max_length": 96, "logging_steps": 1, "save_steps": 2, "max_eval_rows": 4,
            "load_in_4bit": False,
            "verify_prompts": ["What is the code word?", "Name a fruit."],
            "sft": {"max_steps": 4, "learning_rate": 0.005},
            "dpo": {"max_steps": 2, "learning_rate": 0.001}}
    base.update(over)
    path = tmp / "recipe.yaml"
    import yaml

    path.write_text(yaml.safe_dump(base))
    return path


def cli_process(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
