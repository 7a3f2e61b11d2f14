"""Training's checks that run before any weight is loaded (tasks/training/train.py): the card's
free memory, the dataset, the base model. (Training itself: tests/integration/test_train.py.)"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tasks.shared.errors import ConfigError
from tasks.training.train import TrainingError, check_free_memory
from tests.support.training import MSG, sft_parquet


def test_a_card_without_room_is_refused_naming_both_numbers() -> None:
    with pytest.raises(TrainingError, match="1024 MiB free of 24576 MiB, the run needs 20000"):
        check_free_memory("NVIDIA L4", 1024, 24576, 20000)
    check_free_memory("NVIDIA L4", 22000, 24576, 20000)  # enough: no error


def test_empty_dataset_and_missing_base_model_fail_before_any_weight(tmp_path: Path) -> None:
    from tasks.training.train import load_splits, resolve_base_model

    empty = tmp_path / "empty.parquet"
    pl.DataFrame({"messages": [], "split": []}, schema={"messages": MSG, "split": pl.String}) \
        .write_parquet(empty)
    with pytest.raises(ConfigError, match="no training rows"):
        load_splits(empty, "sft", 8)
    with pytest.raises(ConfigError, match="columns .*'chosen'.* missing for method dpo"):
        load_splits(sft_parquet(tmp_path / "s.parquet"), "dpo", 8)
    with pytest.raises(ConfigError, match="not found — run the scorecard"):
        load_splits(tmp_path / "missing.parquet", "sft", 8)
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_base_model(str(tmp_path / "no-such-model"), tmp_path)
    with pytest.raises(ConfigError, match="GGUF file not found"):
        resolve_base_model(str(tmp_path / "m.gguf"), tmp_path)
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
        resolve_base_model("no-org/no-model@main", tmp_path)
