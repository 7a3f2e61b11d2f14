"""Base-model artefacts derived from the served GGUF: a float32 HF folder to train on, and an F32
GGUF to verify adapters against.

The nightly serves one GGUF with llama.cpp, so that file is the single source of truth: training
must start from exactly those weights, not from a hub checkpoint that may differ. Dequantizing is
slow (~30 s for SmolLM2-135M) and the result never changes for a given file, so each derivative is
built once, into a temporary folder renamed into place (a half-written cache entry can never be
mistaken for a finished one), under a key taken from the file itself.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tasks.shared.errors import ConfigError
from tasks.shared.files import replacing, sha256_hex
from tasks.training.quiet import quiet_libraries

DIGEST_BLOCK = 1 << 20  # bytes hashed at each end of the file
HF_MARKER = "config.json"  # present in every finished HF folder


def gguf_digest(gguf_path: Path) -> str:
    """A fast key for a GGUF: name, size and a hash of its first and last MiB.

    A full hash of a multi-GB model costs seconds on every nightly run; the header (metadata,
    tensor table) and the tail (last tensors) change whenever the model does. mtime is left out
    so a copied or re-downloaded identical file still hits the cache.
    """
    path = _require_file(gguf_path, "GGUF model")
    size = path.stat().st_size
    with path.open("rb") as f:
        data = f"{path.name}\0{size}\0".encode() + f.read(DIGEST_BLOCK)
        if size > DIGEST_BLOCK:
            f.seek(max(DIGEST_BLOCK, size - DIGEST_BLOCK))
            data += f.read(DIGEST_BLOCK)
    return sha256_hex(data, 16)


def hf_cache_entry(gguf_path: Path, cache_dir: Path) -> Path:
    """Where hf_from_gguf keeps (or will keep) this GGUF's dequantized folder; finished when
    it holds HF_MARKER."""
    gguf_path = _require_file(gguf_path, "GGUF model")
    return Path(cache_dir) / f"{gguf_path.stem}-{gguf_digest(gguf_path)}-hf"


def hf_from_gguf(gguf_path: Path, cache_dir: Path) -> Path:
    """Dequantize a GGUF into a float32 transformers folder (weights, config, tokenizer,
    generation config), once; later calls return the cached folder without loading anything.

    transformers un-permutes llama q/k rows while loading a GGUF, so the folder is in HF layout;
    llama.cpp's convert_lora_to_gguf.py (tasks.training.convert) re-applies that permutation
    when it exports an adapter.
    """
    target = hf_cache_entry(gguf_path, cache_dir)
    if (target / HF_MARKER).is_file():
        return target
    with _staging_dir(target) as tmp:
        # transformers draws raw tqdm bars here (one per dequantized tensor, one per shard
        # written), not behind its progress-bar switch: they go nowhere. Warnings go to
        # logging (quiet_libraries) and errors propagate as exceptions, so nothing is lost.
        with quiet_libraries(), contextlib.redirect_stderr(io.StringIO()):
            _dequantize_into(gguf_path, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by the pipeline's users
        _publish(tmp, target)
    return target


def f32_gguf(gguf_path: Path, cache_dir: Path) -> Path:
    """An all-F32 copy of a (quantized) GGUF, once.

    Quantized matmuls already change greedy text on some prompts, so an adapter can only be
    checked token-for-token against HF+PEFT on an unquantized copy of the same weights.
    """
    gguf_path = _require_file(gguf_path, "GGUF model")
    target = Path(cache_dir) / f"{gguf_path.stem}-{gguf_digest(gguf_path)}.F32.gguf"
    if target.is_file():
        return target
    with replacing(target) as tmp:
        _quantize_f32(gguf_path, tmp)
        tmp.chmod(0o644)
    return target


def _require_file(path: Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path} — pass the path of an existing .gguf file "
                          "(tasks.engine.llama_cpp.default_model_path() gives the bundled one)")
    return path


@contextlib.contextmanager
def _staging_dir(target: Path) -> Iterator[Path]:
    """A scratch folder next to `target` (same filesystem, so the final rename is atomic),
    removed whatever happens."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, target: Path) -> None:
    """Rename a finished folder into place; if a concurrent run got there first, keep theirs."""
    try:
        os.rename(tmp, target)
    except OSError:
        if not (target / HF_MARKER).is_file():
            raise


def _dequantize_into(gguf_path: Path, out_dir: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, never a hub round-trip
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32,
                                                     local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
    except (ValueError, OSError, KeyError) as e:
        raise ConfigError(f"transformers cannot dequantize {gguf_path}: {e} — the architecture "
                          "or quantization type may be unsupported by transformers' GGUF loader; "
                          "use a llama/qwen2/gemma GGUF in Q4_0/Q4_1/Q8_0/F16/F32") from e
    # The loaded model still remembers it came from a GGUF and save_pretrained refuses
    # ("quantized with gguf"); its weights are plain float32 tensors by now.
    # setattr: torch's Module.__setattr__ typing only knows tensors and modules.
    setattr(model, "hf_quantizer", None)  # noqa: B010
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)


def _quantize_f32(src: Path, dst: Path) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True  # the source is already quantized: dequantizing is the point
    params.nthread = max(1, min(4, os.cpu_count() or 1))
    # llama.cpp logs one line per tensor (272 for SmolLM2) through llama-cpp-python's callback,
    # which prints whatever its logger's level lets through: keep errors only while converting.
    llama_logger = logging.getLogger("llama-cpp-python")
    level = llama_logger.level
    llama_logger.setLevel(logging.ERROR)
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    finally:
        llama_logger.setLevel(level)
    if rc != 0 or not dst.is_file() or dst.stat().st_size == 0:
        raise ConfigError(f"llama.cpp could not write an F32 copy of {src} (return code {rc}) — "
                          "check the file loads with llama.cpp and that the cache folder "
                          f"{dst.parent} has room for ~4 bytes per parameter")
