"""llama.cpp's own converters, run as tools: HF base → GGUF, PEFT LoRA → GGUF LoRA.

The adapter the nightly serves must be converted by the conversion code of the llama.cpp it
runs on (the operators' requirement), not by a re-implementation that drifts from it: that code
knows each architecture's tensor names and layouts (llama's rope-permuted q/k rows, OLMo 3's
sliding-window pattern, …). It is not in llama-cpp-python's wheel, only in its source
distribution (vendor/llama.cpp: convert_hf_to_gguf.py, convert_lora_to_gguf.py, the
`conversion/` package and its own gguf-py). `install()` unpacks exactly those, for the
llama-cpp-python version installed — so the converters and the llama.cpp that loads their
output never drift apart — into the virtual environment (`make` runs it; the node image runs
`python -m tasks.training.convert install` too). They run as subprocesses of this interpreter
with their own gguf-py first on the path.

`supported_architectures` and `export_problems` answer, before any weight loads, whether the
converter can export a given base + LoRA configuration correctly; preflight calls them.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from tasks.engine.llama_build import download_sdist
from tasks.engine.llama_cpp import DIST, INSTALL_HINT, BuildError, llama_cpp_version, tools_dir
from tasks.shared.errors import ConfigError, SlmNightlyError
from tasks.shared.files import replacing

VENDOR = "vendor/llama.cpp/"
# What the two converters import from the sdist: nothing else is unpacked.
MEMBERS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/",
           "LICENSE")
# Kept beside them for tasks/compute/engines.py: the architecture names this llama.cpp loads
# (LLM_ARCH_NAMES). Not required by the converters, so an older install still converts.
ENGINE_MEMBERS = ("src/llama-arch.cpp",)
FIX_TARGETS = ("set peft.target_modules to the transformer blocks' linear layers only "
               "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")
EMBEDDING_MODULES = ("embed_tokens", "lm_head", "wte", "wpe", "embed_in", "embed_out",
                     "word_embeddings")
STDERR_TAIL = 3000


class ConversionError(SlmNightlyError):
    """A converter ran and failed (the message holds the command and its stderr tail)."""


# --- the tools --------------------------------------------------------------------------------


def require_tools() -> Path:
    """The tools folder, or a ConfigError naming the command that installs it."""
    tools = tools_dir()
    missing = [m for m in MEMBERS if not (tools / m.rstrip("/")).exists()]
    if missing:
        raise ConfigError(f"llama.cpp's converters are not installed at {tools} (missing: "
                          f"{', '.join(missing)}) — {INSTALL_HINT}")
    return tools


def install(dest: Path | None = None) -> Path:
    """Unpack the converters from the pinned sdist (pip downloads it, or takes pip's cache).

    Idempotent (a complete folder is left alone) and atomic (unpacked into a temporary sibling,
    renamed into place), so an interrupted install is never taken for a finished one.
    """
    dest = Path(dest) if dest else tools_dir()
    if all((dest / m.rstrip("/")).exists() for m in MEMBERS + ENGINE_MEMBERS):
        return dest
    version = llama_cpp_version()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".sdist-", dir=dest.parent) as tmp:
        try:
            sdist = download_sdist(version, Path(tmp))
        except BuildError as e:
            raise ConfigError(str(e)) from e
        staging = Path(tmp) / "tools"
        _extract(sdist, staging)
        (staging / "VERSION").write_text(f"{DIST} {version}\n")
        shutil.rmtree(dest, ignore_errors=True)  # an incomplete earlier folder
        try:
            os.rename(staging, dest)
        except OSError:  # a concurrent install renamed its copy first: keep theirs
            if not all((dest / m.rstrip("/")).exists() for m in MEMBERS + ENGINE_MEMBERS):
                raise
    return dest


def _extract(sdist: Path, out: Path) -> None:
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        prefix = f"{root}/{VENDOR}"
        picked = []
        for member in tar.getmembers():
            rel = member.name.removeprefix(prefix)
            if member.name.startswith(prefix) and any(
                    rel == m or (m.endswith("/") and rel.startswith(m))
                    for m in MEMBERS + ENGINE_MEMBERS):
                member.name = rel
                picked.append(member)
        if not picked:
            raise ConfigError(f"{sdist} has no {VENDOR} converters — is it llama-cpp-python's "
                              "source distribution?")
        tar.extractall(out, members=picked, filter="data")


@functools.cache
def _registered(tools: Path) -> frozenset[str]:
    # conversion/__init__.py routes an HF `architectures[0]` to its model module through the
    # literal dict TEXT_MODEL_MAP (get_model_class raises NotImplementedError for any other
    # name): reading it costs nothing, importing the package would import torch.
    source = (tools / "conversion" / "__init__.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "TEXT_MODEL_MAP" for t in targets) \
                    and node.value is not None:
                return frozenset(ast.literal_eval(node.value))
    raise ConfigError(f"{tools}/conversion/__init__.py has no TEXT_MODEL_MAP — the installed "
                      "converter's layout changed; update tasks.training.convert")


def supported_architectures() -> frozenset[str]:
    """The HF `architectures` names the installed converter registers (text models)."""
    return _registered(require_tools())


def hf_architecture(hf_config: dict[str, Any]) -> str | None:
    """The architecture name the converter routes on (as its get_model_architecture does)."""
    text = hf_config.get("text_config") or {}
    arches = text.get("architectures") or hf_config.get("architectures") or []
    return str(arches[0]) if arches else None


# --- what the converter cannot export (read from convert_lora_to_gguf.py, llama.cpp 0.3.36) ----


def export_problems(hf_config: dict[str, Any], lora: dict[str, Any]) -> list[str]:
    """What the installed converter cannot export, or would export wrongly, for this base
    (its config.json as a dict) and LoRA (PEFT LoraConfig fields). Empty: exportable.

    convert_lora_to_gguf.py writes one `adapter.lora.alpha` = lora_alpha per file, and llama.cpp
    scales each tensor by alpha / rank (rank read from the tensor); every tensor of the adapter
    must be a lora_A/lora_B pair of a weight the base GGUF has. Hence:
    - rank_pattern is exported right (the rank is per tensor on both sides);
    - alpha_pattern and use_rslora (alpha / sqrt(r)) are silently dropped: wrong scale;
    - DoRA magnitudes, trained biases, modules_to_save, trainable tokens are not lora_A/B pairs:
      the converter exits (or, for a saved norm, writes a full tensor as if it were a LoRA);
    - LoRA on embeddings / lm_head: refused. The converter raises for lm_head on a base with tied
      embeddings, and llama.cpp looks LoRA weights up by base tensor, so on a tied base an
      embedding LoRA would reach the output matmul too, which PEFT does not do. On an untied base
      both converted and verified (tiny OLMo 3, measured); the recipes never target them, so
      they stay refused until a test verifies them on the bases that would use them.
    """
    problems = []
    arch = hf_architecture(hf_config)
    supported = supported_architectures()
    if arch is None:
        problems.append("the base model's config.json names no `architectures` — the converter "
                        "routes on it; use a transformers checkpoint folder with a full config")
    elif arch not in supported:
        near = difflib.get_close_matches(arch, sorted(supported), n=3, cutoff=0.8)
        problems.append(f"architecture {arch} is not supported by llama.cpp's converter "
                        f"({DIST} {llama_cpp_version()}; close: {', '.join(near) or 'none'}) — "
                        "choose a supported base model, or set export_gguf: false (PEFT adapter "
                        "only)")
    if str(lora.get("peft_type", "LORA")).upper() != "LORA":
        problems.append(f"peft_type {lora.get('peft_type')!r} is not LoRA — only LoRA adapters "
                        "convert to GGUF")
    if lora.get("use_dora"):
        problems.append("use_dora: true — DoRA's magnitude vectors are not a LoRA pair and "
                        "llama.cpp cannot apply them; set peft.use_dora: false")
    if lora.get("use_rslora"):
        problems.append("use_rslora: true — the converter writes lora_alpha and llama.cpp scales "
                        "by alpha/r, not rsLoRA's alpha/sqrt(r); set peft.use_rslora: false")
    if lora.get("alpha_pattern"):
        problems.append(f"alpha_pattern {lora['alpha_pattern']} — the converter writes one alpha "
                        "per file and drops per-module alphas; remove peft.alpha_pattern "
                        "(rank_pattern is fine)")
    if lora.get("modules_to_save"):
        problems.append(f"modules_to_save {lora['modules_to_save']} — full saved modules are "
                        "not LoRA pairs a GGUF adapter can carry; remove peft.modules_to_save")
    if str(lora.get("bias", "none")) != "none" or lora.get("lora_bias"):
        problems.append(f"bias={lora.get('bias')!r}, lora_bias={lora.get('lora_bias')!r} — "
                        "trained biases are not part of a GGUF LoRA; set peft.bias: none and "
                        "peft.lora_bias: false")
    if lora.get("trainable_token_indices"):
        problems.append("trainable_token_indices changes embedding rows a GGUF LoRA cannot "
                        "carry; remove peft.trainable_token_indices")
    for module in _embedding_targets(lora.get("target_modules")):
        problems.append(f"target_modules includes {module!r} (embeddings / lm_head): not "
                        f"exported correctly for every base (tied embeddings) — {FIX_TARGETS}")
    if lora.get("lora_alpha") in (0, 0.0):
        problems.append("lora_alpha 0 makes the adapter a no-op in llama.cpp — set "
                        "peft.lora_alpha > 0")
    return problems


def _embedding_targets(targets: Any) -> list[str]:
    if isinstance(targets, str):  # a regex, or PEFT's "all-linear" (which excludes lm_head)
        return [m for m in EMBEDDING_MODULES if targets != "all-linear" and m in targets]
    return [str(t) for t in targets or [] if str(t).split(".")[-1] in EMBEDDING_MODULES]


# --- running them --------------------------------------------------------------------------


def _run(script: str, args: list[str], what: str, timeout_s: float) -> subprocess.CompletedProcess:
    tools = require_tools()
    env = dict(os.environ)
    # The converter's own gguf-py first (it also inserts it itself unless NO_LOCAL_GGUF), and
    # never a hub round-trip: everything it needs is in the folders passed to it.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tools / "gguf-py"), str(tools), env.get("PYTHONPATH", "")) if p)
    env.pop("NO_LOCAL_GGUF", None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, str(tools / script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tools,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise ConversionError(f"{what}: {' '.join(cmd)} ran over {timeout_s:.0f} s") from e
    if proc.returncode != 0:
        raise ConversionError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                              f"{proc.stderr[-STDERR_TAIL:]}")
    return proc


def _read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path} — {fix}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} is not valid JSON ({e}) — {fix}") from e
    return data if isinstance(data, dict) else {}


def export_lora(peft_dir: Path, base_hf_dir: Path, out_path: Path, outtype: str = "f32",
                *, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Convert a PEFT adapter folder to a GGUF LoRA with convert_lora_to_gguf.py.

    Refuses up front what the converter would export wrongly (`export_problems`); writes
    `out_path` atomically (the server sees the old file or the new one, never a torn write).
    Returns {path, arch, tensors, bytes, seconds, outtype, tool}.
    """
    # Absolute: the converter runs from the tools folder.
    peft_dir, base_hf_dir, out_path = (Path(p).resolve() for p in (peft_dir, base_hf_dir,
                                                                    out_path))
    require_tools()
    lora = _read_json(peft_dir / "adapter_config.json", "PEFT adapter config",
                      "save the adapter with model.save_pretrained(adapter_dir)")
    base = _read_json(base_hf_dir / "config.json", "base model config",
                      "pass the base model's HF folder")
    problems = export_problems(base, lora)
    if problems:
        raise ConfigError(f"{peft_dir} cannot be exported to GGUF: " + "; ".join(problems))
    start = time.monotonic()
    with replacing(out_path) as tmp:
        _run("convert_lora_to_gguf.py", ["--base", str(base_hf_dir), "--outtype", outtype,
                                         "--outfile", str(tmp), str(peft_dir)],
             f"exporting {peft_dir} to GGUF", timeout_s)
        tmp.chmod(0o644)
    return {"path": str(out_path), **gguf_summary(out_path), "outtype": outtype,
            "bytes": out_path.stat().st_size, "seconds": round(time.monotonic() - start, 2),
            "tool": f"{DIST} {llama_cpp_version()} convert_lora_to_gguf.py"}


def export_base(hf_dir: Path, out_path: Path, outtype: str = "f32", *,
                timeout_s: float = 3600.0) -> Path:
    """Convert an HF model folder to a GGUF with convert_hf_to_gguf.py (atomically)."""
    hf_dir, out_path = Path(hf_dir).resolve(), Path(out_path).resolve()
    require_tools()
    base = _read_json(hf_dir / "config.json", "model config", "pass an HF model folder")
    arch = hf_architecture(base)
    if arch not in supported_architectures():
        raise ConfigError(f"{hf_dir}: architecture {arch} is not supported by llama.cpp's "
                          "converter — choose a supported model")
    with replacing(out_path) as tmp:
        _run("convert_hf_to_gguf.py", ["--outtype", outtype, "--outfile", str(tmp), str(hf_dir)],
             f"converting {hf_dir} to GGUF", timeout_s)
        tmp.chmod(0o644)
    return out_path


def gguf_summary(path: Path) -> dict[str, Any]:
    """general.architecture, general.type and the tensor count of a GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)

    def field(name: str) -> Any:
        f = reader.fields.get(name)
        return f.contents() if f is not None else None

    return {"arch": field("general.architecture"), "type": field("general.type"),
            "tensors": len(reader.tensors)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        start = time.monotonic()
        where = install(Path(argv[1]) if len(argv) > 1 else None)
        print(f"llama.cpp converters ({DIST} {llama_cpp_version()}) at {where} "
              f"({time.monotonic() - start:.1f} s)")
        return 0
    if argv[:1] == ["supported"]:
        print("\n".join(sorted(supported_architectures())))
        return 0
    print("usage: python -m tasks.training.convert install [DIR] | supported", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
