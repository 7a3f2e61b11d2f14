"""Where the node reads each piece of its model folder (the node settings and the recipe), and
the names the image builder's messages use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.shared.errors import ConfigError

MANIFEST = "weights-manifest.json"
COMMAND = "slm-nightly node prepare-weights"  # how the operator runs it (messages name it)
GGUF_MAGIC = b"GGUF"


class WeightsError(ConfigError):
    """The model folder is incomplete or wrong: raised with every failing check."""


@dataclass(frozen=True)
class WeightsLayout:
    """Where the node reads each piece (the node settings and the recipe)."""

    model_path: Path
    model_architecture: str
    tokenizer: Path
    hf_home: Path
    base_model: str  # org/name[@revision]
    base_gguf: Path | None = None

    @classmethod
    def from_settings(cls, settings: Any, base_model: str,
                      base_gguf: str | None = None) -> WeightsLayout:
        """From blocks/node_serve.py's NodeServeSettings (model_path, model_architecture,
        tokenizer, hf_home) and the recipe's base_model / base_gguf."""
        return cls(Path(settings.model_path), settings.model_architecture,
                   Path(settings.tokenizer), Path(settings.hf_home), base_model,
                   Path(base_gguf) if base_gguf else None)

    @property
    def repo(self) -> str:
        repo = self.base_model.partition("@")[0]
        if repo.count("/") != 1 or repo.endswith(".gguf"):
            raise ConfigError(f"base model {self.base_model!r}: the node's base must be a hub "
                              "id 'org/name@revision' (the recipe's base_model) to live in the "
                              "Hugging Face cache")
        return repo

    @property
    def revision(self) -> str:
        return self.base_model.partition("@")[2] or "main"

    @property
    def cache_repo_dir(self) -> Path:
        return self.hf_home / "hub" / ("models--" + self.repo.replace("/", "--"))

    @property
    def manifest_path(self) -> Path:
        return self.model_path.parent / MANIFEST

