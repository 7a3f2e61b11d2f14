"""The node image's model folder, checked: every file against the manifest, the GGUF(s), the
tokenizer and the base loading offline as the node loads them, and llama.cpp's converter for
the base (tasks/image/weights.py says what and why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tasks.image.layout import COMMAND, GGUF_MAGIC, WeightsLayout
from tasks.shared.checks import Check, failure, passed
from tasks.shared.errors import ConfigError
from tasks.shared.files import file_sha256
from tasks.training import convert


def as_record(check: Check) -> dict[str, Any]:
    """A check as the manifest and `--json` have always written it."""
    return {"name": check.name, "status": check.status, "detail": check.detail}


def check_weights(layout: WeightsLayout) -> list[Check]:
    """`--check`: every file the manifest records against its size and sha256, then
    run_checks. Nothing is copied or written."""
    path = layout.manifest_path
    if not path.is_file():
        return [failure("manifest", f"{path} not found — build the folder with "
                      f"`{COMMAND} --source …` first")]
    manifest = json.loads(path.read_text(encoding="utf-8"))
    records = [manifest["files"]["model"], *manifest["files"]["tokenizer"],
               *manifest["files"]["base"]]
    if manifest["files"].get("base_gguf"):
        records.append(manifest["files"]["base_gguf"])
    bad = []
    for r in records:
        p = Path(r["path"])
        if not p.is_file():
            bad.append(f"{p} is missing")
        elif p.stat().st_size != r["size"]:
            bad.append(f"{p} has {p.stat().st_size:,} bytes, the manifest {r['size']:,}")
        elif file_sha256(p) != r["sha256"]:
            bad.append(f"{p}: sha256 differs from the manifest's")
    files = failure("files", "; ".join(bad) + f" — run `{COMMAND}` again (it copies only "
                    "what differs)") if bad else passed(
        "files", f"{len(records)} files match {path} (size and sha256)")
    return [files, *run_checks(layout)]


def run_checks(layout: WeightsLayout) -> list[Check]:
    """The GGUF(s), then the tokenizer and the base loading offline, then the converter."""
    checks = [gguf_check(layout.model_path, layout.model_architecture, "model_architecture")]
    if layout.base_gguf:
        checks.append(gguf_check(layout.base_gguf, None, None))
    offline = _load_offline(layout)
    checks.append(offline["tokenizer"])
    checks.append(offline["base"])
    config = offline.get("config")
    if config is not None:
        checks.append(_converter_check(config, layout.repo))
    return checks


def gguf_check(path: Path, architecture: str | None, setting: str | None) -> Check:
    """The file is a whole GGUF (magic, metadata, tensor data up to the end) and, with
    `architecture`, its general.architecture is that."""
    name = f"GGUF {path.name}"
    if not path.is_file():
        return failure(name, f"{path} not found — run `{COMMAND}`")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        return failure(name, f"{path} is not a GGUF file (starts with {magic!r}, not "
                     "b'GGUF') — the source holds something else under that name")
    size = path.stat().st_size
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
        arch = reader.fields["general.architecture"].contents()
    except (ValueError, IndexError, KeyError, OSError) as e:
        return failure(name, f"{path} ({size:,} bytes) is damaged or truncated "
                     f"({type(e).__name__}: {str(e)[:150]}) — copy it again: delete it and "
                     f"run `{COMMAND}` (it resumes)")
    if end > size:
        return failure(name, f"{path} is truncated: its tensors end at byte {end:,}, "
                     f"the file has {size:,} — delete it and run `{COMMAND}`")
    if architecture is not None and arch != architecture:
        return failure(name, f"{path}: general.architecture is {arch!r}, the node "
                     f"settings' {setting} is {architecture!r} — copy the model the node "
                     f"serves (OLMo 3 GGUFs say 'olmo2'), or set [compute.node] {setting} to "
                     "the file's if the engine loads it")
    return passed(name, f"{path}: {arch}, {len(reader.tensors)} tensors, {size:,} bytes")


_OFFLINE = r"""
import json, sys
spec, out = json.loads(sys.argv[1]), {}
try:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(spec["tokenizer"], local_files_only=True)
    out["tokenizer"] = {"ok": f"{type(tok).__name__}, {len(tok)} tokens"}
except Exception as e:
    out["tokenizer"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
try:
    from huggingface_hub import snapshot_download
    from transformers import AutoConfig
    path = snapshot_download(spec["repo"], revision=spec["revision"], local_files_only=True)
    config = AutoConfig.from_pretrained(spec["repo"], revision=spec["revision"],
                                        local_files_only=True)
    out["base"] = {"ok": f"{path} ({config.model_type})",
                   "config": json.load(open(path + "/config.json"))}
except Exception as e:
    out["base"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
print(json.dumps(out))
"""


def offline_env(hf_home: Path) -> dict[str, str]:
    """The node's environment for Hugging Face loads: its HF_HOME, and no network."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")}
    return env | {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _load_offline(layout: WeightsLayout) -> dict[str, Any]:
    """Tokenizer and base config loaded in a child process, offline, as the node loads them."""
    spec = {"tokenizer": str(layout.tokenizer), "repo": layout.repo,
            "revision": layout.revision}
    proc = subprocess.run([sys.executable, "-c", _OFFLINE, json.dumps(spec)],
                          env=offline_env(layout.hf_home), capture_output=True, text=True,
                          timeout=600)
    try:
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        why = f"the check process exited {proc.returncode}: {proc.stderr[-500:]}"
        return {"tokenizer": failure("tokenizer", why),
                "base": failure("base model", why)}
    tok, base = got["tokenizer"], got["base"]
    return {
        "tokenizer": passed("tokenizer", f"{layout.tokenizer} loads offline: {tok['ok']}")
        if "ok" in tok else failure("tokenizer", f"{layout.tokenizer} does not load "
                                  f"with HF_HUB_OFFLINE=1: {tok['error']} — the folder needs "
                                  "the tokenizer files (tokenizer.json, tokenizer_config.json); "
                                  "copy the model repo's into the source's tokenizer folder"),
        "base": passed("base model", f"{layout.base_model} loads offline from "
                      f"HF_HOME={layout.hf_home}: {base['ok']}")
        if "ok" in base else failure("base model", f"{layout.base_model} does not load "
                                   f"with HF_HOME={layout.hf_home} HF_HUB_OFFLINE=1: "
                                   f"{base['error']} — run `{COMMAND}` with the base's HF "
                                   "folder in the source"),
        "config": base.get("config")}


def _converter_check(config: dict[str, Any], repo: str) -> Check:
    arch = convert.hf_architecture(config)
    try:
        known = convert.supported_architectures()
    except ConfigError as e:
        return failure("converter", str(e))
    if arch not in known:
        return failure("converter", f"{repo} is {arch or 'without architectures'}, "
                     "which llama.cpp's converter cannot export adapters for — train on a base "
                     "the converter supports (`python -m tasks.training.convert` lists them)")
    return passed("converter", f"{arch}: llama.cpp's converter exports its adapters")

