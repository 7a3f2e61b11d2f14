"""Prove a GGUF LoRA does in llama.cpp what the PEFT adapter does in transformers, before serving it.

llama.cpp is forgiving in the worst way: a wrong-layout adapter loads and quietly computes
something else, a missing one is skipped, and an invalid one can segfault on the first token.
So the check runs in a child process (a crash becomes an error here, not the end of the flow)
and asks three questions on the same prompt token ids, greedy decoding on both sides:

1. did llama.cpp really attach the adapter (`Llama._lora_adapter`)?
2. does it change at least one output (an adapter that changes nothing was not applied)?
3. is every output token-for-token the HF+PEFT output (layout, names and scale are right)?

Question 3 needs an unquantized base: quantized matmuls alone already change greedy text on some
prompts. Two plans (`tasks.training.memory` estimates what each needs before anything loads):
- `cpu`: an F32 GGUF (`tasks.training.base_model.f32_gguf`) in llama.cpp, then HF in float32, both
  on the CPU — exact to ~1e-2, but a 7B base needs ~31 GiB of RAM (tasks.training.memory);
- `cuda`: the F16/BF16 GGUF with every layer on the GPU, then HF in bfloat16 on the GPU — the
  engines round differently, so its tolerances (`TOLERANCES["cuda"]`) are wider.
The child records its peak RSS per stage (and the GPU memory in use on the cuda plan), so the
estimates can be checked against what a run really used.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.shared.errors import AdapterVerificationError, ConfigError
from tasks.shared.files import write_atomic

ROOT = Path(__file__).resolve().parents[2]  # the project root: the child runs from it
STAGE = "STAGE "  # progress lines the child prints, so a crash can be placed
EXIT_NOT_LOADED = 3
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class AdapterFiles:
    """One adapter in both engines' forms, each on its base: the GGUF LoRA on the base GGUF
    (llama.cpp) and the PEFT folder on the HF base folder (transformers)."""

    base_gguf: Path
    adapter_gguf: Path
    hf_base_dir: Path
    peft_adapter_dir: Path


def verify_adapter(files: AdapterFiles, prompts: list[str], max_tokens: int = 16,
                   n_threads: int = 2, *, timeout_s: float = 600.0,
                   device: str = "cpu") -> dict[str, Any]:
    """Compare llama.cpp (base GGUF ± adapter GGUF) with transformers + PEFT, in a child process.

    Returns {loaded, prompts, base_outputs, adapter_outputs, peft_outputs, differs_from_base,
    matches_peft, seconds, ...}; raises AdapterVerificationError (with `.report`) when the
    adapter did not load, changed nothing, disagrees with PEFT, or the child crashed/hung.

    Prompts go through the base tokenizer's chat template (when it has one) once, and the same
    token ids feed both engines. `n_threads` also sets torch's threads; on a 2-core machine
    shared with other jobs, n_threads=1 verified 3x faster than 2 (spinning threads starve).

    `device`: "cpu" (HF in float32; pass an F32 GGUF) or "cuda" (HF in bfloat16 on the GPU,
    llama.cpp with every layer offloaded; pass the F16/BF16 GGUF) — see the module docstring.
    """
    start = time.monotonic()
    base_gguf, adapter_gguf = files.base_gguf, files.adapter_gguf
    hf_base_dir, peft_adapter_dir = files.hf_base_dir, files.peft_adapter_dir
    if not prompts:
        raise ConfigError("verify_adapter needs at least one prompt — pass a few short, "
                          "representative prompts")
    if device not in TOLERANCES:
        raise ConfigError(f"verify_adapter: device {device!r} is not one of {sorted(TOLERANCES)}")
    for path, what in ((base_gguf, "base GGUF"), (hf_base_dir, "HF base folder"),
                       (peft_adapter_dir, "PEFT adapter folder")):
        if not Path(path).exists():
            raise ConfigError(f"{what} not found: {path} — check the path (the HF folder comes "
                              "from tasks.training.base_model.hf_from_gguf)")
    report: dict[str, Any] = {"loaded": False, "prompts": list(prompts), "base_outputs": [],
                              "adapter_outputs": [], "peft_outputs": [],
                              "differs_from_base": False, "matches_peft": False}
    if not Path(adapter_gguf).is_file():
        report["seconds"] = round(time.monotonic() - start, 2)
        raise AdapterVerificationError(
            f"adapter not loaded: {adapter_gguf} does not exist — export it first with "
            "tasks.training.convert.export_lora", report)

    with tempfile.TemporaryDirectory(prefix="verify-adapter-") as tmp:
        request, result, log = Path(tmp) / "request.json", Path(tmp) / "result.json", \
            Path(tmp) / "child.log"
        request.write_text(json.dumps({
            "base_gguf": str(base_gguf), "adapter_gguf": str(adapter_gguf),
            "hf_base_dir": str(hf_base_dir), "peft_adapter_dir": str(peft_adapter_dir),
            "prompts": list(prompts), "max_tokens": max_tokens, "n_threads": n_threads,
            **plan_request(device),
        }))
        rc, stage = _run_child(request, result, log, n_threads, timeout_s)
        child = json.loads(result.read_text()) if result.is_file() else {}
        report.update(child)
        report["seconds"] = round(time.monotonic() - start, 2)
        tail = _tail(log)

    where = f"adapter {adapter_gguf} on base {base_gguf}"
    if rc is None:
        raise AdapterVerificationError(
            f"verification of {where} timed out after {timeout_s:.0f} s (last stage: {stage}) — "
            "use fewer/shorter prompts or a smaller max_tokens, or raise timeout_s", report)
    if rc == EXIT_NOT_LOADED or (rc != 0 and stage == "load adapter"):
        how = f"crashed ({_describe(rc)})" if rc != EXIT_NOT_LOADED else "refused it"
        raise AdapterVerificationError(
            f"adapter not loaded: llama.cpp {how} while loading {where} (stage: {stage}) — the "
            "file is missing, corrupt or not a GGUF LoRA for this base's architecture; re-export "
            f"it with tasks.training.convert.export_lora.\nllama.cpp log tail:\n{tail}", report)
    if rc != 0 or not child:
        raise AdapterVerificationError(
            f"verification child {_describe(rc)} at stage {stage!r} for {where} — an invalid "
            "adapter (wrong shapes for this base) segfaults llama.cpp at the first token; "
            f"re-export it against this base.\nlog tail:\n{tail}", report)
    if not report["differs_from_base"]:
        raise AdapterVerificationError(
            f"{where}: the adapter changed neither the greedy output nor the logits on {len(prompts)} "
            "prompt(s) — it was "
            "not applied or is a no-op (zero lora_B, alpha 0); check training saved the trained "
            "weights and the export's alpha", report)
    if not report["matches_peft"] or \
            max(report["first_logit_max_abs_diff"]) > TOLERANCES[device].max_logit_diff:
        bad = [i for i, (a, p) in enumerate(zip(report["adapter_token_ids"],
                                                report["peft_token_ids"], strict=True)) if a != p] \
            or [max(range(len(prompts)), key=lambda i: report["first_logit_max_abs_diff"][i])]
        first = bad[0]
        raise AdapterVerificationError(
            f"{where}: llama.cpp output differs from HF+PEFT on prompt(s) {bad} (first: "
            f"{report['prompts'][first]!r} → llama.cpp {report['adapter_outputs'][first]!r} vs "
            f"PEFT {report['peft_outputs'][first]!r}) — wrong tensor layout (llama q/k "
            "permutation), names or scale in the export; if the base is quantized, verify "
            "against tasks.training.base_model.f32_gguf(base) instead", report)
    return report


def _run_child(request: Path, result: Path, log: Path, n_threads: int,
               timeout_s: float) -> tuple[int | None, str]:
    """Run `python -m tasks.training.verify`; return (exit code or None on timeout, last stage)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(n_threads),
               TOKENIZERS_PARALLELISM="false")
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tasks.training.verify", str(request),
                                 str(result)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            rc = None
    stages = [ln[len(STAGE):] for ln in (out or "").splitlines() if ln.startswith(STAGE)]
    return rc, stages[-1] if stages else "starting"


def _describe(rc: int | None) -> str:
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


def _tail(log: Path) -> str:
    """The log lines that explain a failure: llama.cpp's lora/error lines if any (its verbose
    log ends with a metadata dump that would otherwise bury them), else the last lines."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    telling = [ln for ln in lines if re.search(r"lora|error|fail|abort|assert|traceback", ln, re.I)]
    return "\n".join(ln[:300] for ln in (telling or lines)[-LOG_TAIL_LINES:])


# --- child side -------------------------------------------------------------------------------


_T0 = time.monotonic()
_TIMINGS: dict[str, float] = {}
_MEMORY: dict[str, dict[str, int]] = {}  # stage → its peak RSS (MiB), and GPU memory in use
_CURRENT: list[str] = []


def _stage(name: str) -> None:
    """Announce a stage (the parent names the last one if the child dies), time it, and keep
    the peak RSS of the stage it ends."""
    _TIMINGS[name] = round(time.monotonic() - _T0, 2)
    if _CURRENT:
        _MEMORY[_CURRENT[-1]] = _memory_now()
    _CURRENT.append(name)
    _reset_peak()
    print(f"{STAGE}{name}", flush=True)


def _proc_status() -> dict[str, int]:
    """VmHWM (peak RSS since the last reset), RssAnon, RssFile in MiB; {} off Linux."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    keys = {"VmHWM": "peak_rss_mib", "RssAnon": "rss_anon_mib", "RssFile": "rss_file_mib"}
    return {keys[k]: int(v.split()[0]) // 1024 for k, _, v in (ln.partition(":") for ln in lines)
            if k in keys}


def _reset_peak() -> None:
    try:  # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0, proc(5))
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _memory_now() -> dict[str, int]:
    out = _proc_status()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # Device-wide, so llama.cpp's buffers count too (it does not allocate through torch).
            free, total = torch.cuda.mem_get_info()
            out["gpu_used_mib"] = (total - free) // 2**20
            out["torch_peak_reserved_mib"] = torch.cuda.max_memory_reserved() // 2**20
    return out


def _write(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data))


def _child(request: dict[str, Any], result: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.set_num_threads(int(request["n_threads"]))
    max_tokens = int(request["max_tokens"])
    device = str(request.get("device", "cpu"))
    if device == "cuda":
        torch.cuda.init()  # so the stages' GPU readings include the context from the start
    _stage("tokenize")
    tok = AutoTokenizer.from_pretrained(request["hf_base_dir"], local_files_only=True)
    chat = bool(getattr(tok, "chat_template", None))
    # One tokenisation feeds both engines: differences can then only come from the weights.
    ids = [_prompt_ids(tok, p, chat) for p in request["prompts"]]
    n_ctx = max(len(i) for i in ids) + max_tokens + 8

    _stage("load adapter")
    adapter_llm = _llama(request["base_gguf"], request["adapter_gguf"], n_ctx, request)
    loaded = adapter_llm is not None and bool(adapter_llm._lora_adapter)
    out: dict[str, Any] = {"loaded": loaded, "chat_template": chat}
    _write(result, out)  # a crash further on still reports whether the adapter loaded
    if not loaded:
        return EXIT_NOT_LOADED
    eos = {int(adapter_llm.token_eos())}
    for e in (tok.eos_token_id, getattr(GenerationConfig.from_pretrained(
            request["hf_base_dir"], local_files_only=True), "eos_token_id", None)):
        eos.update([e] if isinstance(e, int) else list(e or []))

    _stage("generate with adapter")
    adapter = [_llama_greedy(adapter_llm, i, max_tokens, eos) for i in ids]
    adapter_llm.close()
    _stage("generate base")
    base_llm = _llama(request["base_gguf"], None, n_ctx, request)
    assert base_llm is not None
    base = [_llama_greedy(base_llm, i, max_tokens, eos) for i in ids]
    base_llm.close()

    _stage("generate peft")
    tie = float(request.get("tie_gap", TIE_LOGIT_GAP))
    from peft import PeftModel

    hf_base = AutoModelForCausalLM.from_pretrained(
        request["hf_base_dir"], dtype=getattr(torch, request.get("hf_dtype", "float32")),
        device_map=device if device != "cpu" else None, local_files_only=True)
    model = PeftModel.from_pretrained(hf_base, request["peft_adapter_dir"], local_files_only=True)
    model.eval()
    gen = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_tokens,
                           eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0])
    peft = []
    with torch.inference_mode():
        for i in ids:
            x = torch.tensor([i], device=device)
            res = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                                 generation_config=gen, output_logits=True,
                                 return_dict_in_generate=True)
            new = _until_eos(res.sequences[0, len(i):].tolist(), eos)
            peft.append((new, res.logits[0][0].float().cpu().numpy(),
                         [step[0].float().cpu().numpy() for step in res.logits]))

    def text(t: list[int]) -> str:
        return str(tok.decode(t, skip_special_tokens=True))

    out.update({
        "base_token_ids": [b[0] for b in base],
        "adapter_token_ids": [a[0] for a in adapter],
        "peft_token_ids": [p[0] for p in peft],
        "base_outputs": [text(b[0]) for b in base],
        "adapter_outputs": [text(a[0]) for a in adapter],
        "peft_outputs": [text(p[0]) for p in peft],
        "differs_from_base": any(a[0] != b[0] for a, b in zip(adapter, base, strict=True))
        or max(float(np.max(np.abs(a[1] - b[1]))) for a, b in zip(adapter, base, strict=True))
        > APPLIED_LOGIT_DELTA,
        "greedy_differs_from_base": any(a[0] != b[0] for a, b in zip(adapter, base, strict=True)),
        "first_logit_delta_vs_base": [round(float(np.max(np.abs(a[1] - b[1]))), 5)
                                      for a, b in zip(adapter, base, strict=True)],
        "matches_peft": all(a[0] == p[0] or _near_tie(a[0], p[0], p[2], tie) is not None
                            for a, p in zip(adapter, peft, strict=True)),
        "exact_matches": sum(a[0] == p[0] for a, p in zip(adapter, peft, strict=True)),
        # Where the engines part ways at a near-tie of HF's own logits (gap < TIE_LOGIT_GAP),
        # the two greedy choices are equally right: float rounding picks one or the other.
        "near_tie_divergences": [
            {"prompt": n, "position": t[0], "hf_logit_gap": t[1]}
            for n, (a, p) in enumerate(zip(adapter, peft, strict=True))
            if a[0] != p[0] and (t := _near_tie(a[0], p[0], p[2], tie)) is not None],
        # How far apart the engines are before any token choice: ~1e-2 on an F32 base,
        # whole units when the layout is wrong.
        "first_logit_max_abs_diff": [round(float(np.max(np.abs(a[1] - p[1]))), 5)
                                     for a, p in zip(adapter, peft, strict=True)],
    })
    _stage("done")
    out["stage_started_at"] = dict(_TIMINGS)  # seconds since the child started
    out["memory_mib"] = dict(_MEMORY)  # per stage: peak RSS (+ GPU memory in use on cuda)
    out["peak_rss_mib"] = max(m.get("peak_rss_mib", 0) for m in _MEMORY.values())
    out["device"] = device
    _write(result, out)
    return 0


# The cuda plan's bounds, from the CPU measurement of the same engines and dtypes
# (bench/verify_tolerance.py, two random LoRAs and a trained one, 6 prompts × 16 tokens,
# 2026-11): llama.cpp on an F16 or BF16 GGUF vs HF in bfloat16 differed in first-token logits
# by at most 0.53 (SmolLM2-135M, 30 layers) and 0.12 (tiny OLMo 3); greedy outputs parted only
# where HF's bfloat16 logits tied (gap 0.0–0.0625: bf16 logits are coarse). Bounds: twice the
# worst measured difference. A wrong layout or scale is off by whole units (2.5–10 on SmolLM2),
# well above them. Estimates for the GPU (cuBLAS may round differently) until
# bench/verify_7b.py measures them there.
CUDA_MEASURED_MAX_LOGIT_DIFF = 0.53
CUDA_TIE_GAP = 2 * CUDA_MEASURED_MAX_LOGIT_DIFF
CUDA_MAX_LOGIT_DIFF = 2 * CUDA_MEASURED_MAX_LOGIT_DIFF


@dataclass(frozen=True)
class Tolerance:
    """How far llama.cpp and HF may part on one plan: a greedy divergence at a token whose HF
    logit gap is under `tie_gap` is a rounding tie; any first-token logit further apart than
    `max_logit_diff` fails. A wrong layout is off by whole units either way."""

    tie_gap: float
    max_logit_diff: float
    source: str


TOLERANCES: dict[str, Tolerance] = {
    # F32 llama.cpp vs HF float32: logits differ by ~0.02 (SmolLM2, 3 prompts).
    "cpu": Tolerance(0.1, 0.5, "measured: F32 GGUF vs HF float32, SmolLM2-135M"),
    # F16 GGUF vs HF bfloat16: bf16 keeps 8 mantissa bits, so the engines part by more.
    "cuda": Tolerance(CUDA_TIE_GAP, CUDA_MAX_LOGIT_DIFF,
                      "estimate: F16/BF16 GGUF vs HF bfloat16 measured on the CPU, x2 margin"),
}
TIE_LOGIT_GAP = TOLERANCES["cpu"].tie_gap
MAX_ENGINE_LOGIT_DIFF = TOLERANCES["cpu"].max_logit_diff
# A weakly trained adapter may change no greedy token yet; it must still move the logits.
APPLIED_LOGIT_DELTA = 0.05


def plan_request(device: str) -> dict[str, Any]:
    """What the child needs to run one plan: where HF runs, in which dtype, and how many layers
    llama.cpp offloads (-1: all)."""
    if device == "cuda":
        return {"device": "cuda", "hf_dtype": "bfloat16", "n_gpu_layers": -1,
                "tie_gap": TOLERANCES["cuda"].tie_gap}
    return {"device": "cpu", "hf_dtype": "float32", "n_gpu_layers": 0,
            "tie_gap": TOLERANCES["cpu"].tie_gap}


def _near_tie(ours: list[int], theirs: list[int], hf_logits: list[Any], tie_gap: float
              ) -> tuple[int, float] | None:
    """(position, HF logit gap) when the two outputs first differ at a token HF itself nearly
    tied with the one it chose; None for a real difference."""
    d = next((k for k, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y),
             min(len(ours), len(theirs)))
    if d >= len(ours) or d >= len(theirs) or d >= len(hf_logits):
        return None  # one is a prefix of the other: a length difference, not a tie
    gap = float(hf_logits[d][theirs[d]] - hf_logits[d][ours[d]])
    return (d, round(gap, 5)) if gap < tie_gap else None


def _prompt_ids(tok: Any, prompt: str, chat: bool) -> list[int]:
    if chat:
        enc = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, tokenize=True)
        if isinstance(enc, dict) or hasattr(enc, "input_ids"):
            enc = enc["input_ids"]
        return [int(t) for t in enc]
    return [int(t) for t in tok(prompt)["input_ids"]]


def _llama(model_path: str, lora_path: str | None, n_ctx: int, request: dict[str, Any]) -> Any:
    from llama_cpp import Llama

    threads = int(request["n_threads"])
    try:
        # n_threads_batch: llama-cpp-python's default is every core, whose spinning threads
        # made the prompt's decode erratic (1-10 s) beside another job on the same cores
        return Llama(model_path=model_path, lora_path=lora_path, n_ctx=max(n_ctx, 64),
                     n_batch=max(n_ctx, 64), n_threads=threads, n_threads_batch=threads, seed=0,
                     n_gpu_layers=int(request.get("n_gpu_layers", 0)), logits_all=False,
                     verbose=True)
    except RuntimeError as e:
        # llama-cpp-python raises "Failed to initialize/set LoRA adapter ..." when llama.cpp
        # rejects the file; a base that does not load is a different error and propagates.
        if lora_path is None or "lora" not in str(e).lower():
            raise
        print(f"adapter load failed: {e}", file=sys.stderr, flush=True)
        return None


def _llama_greedy(llm: Any, prompt: list[int], max_tokens: int,
                  eos: set[int]) -> tuple[list[int], Any]:
    """Argmax decoding on llama.cpp's raw logits (no sampler, no penalties), like HF greedy."""
    import llama_cpp

    llm.reset()
    # The prompt in one decode, which reads the weights once: 1.7x faster than a token at a time
    # on the CPU plan (bench/verify_greedy.py); the logits agree with HF either way.
    llm.eval(prompt)
    out: list[int] = []
    first = None
    for _ in range(max_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                       shape=(llm.n_vocab(),)).copy()
        if first is None:
            first = logits
        t = int(np.argmax(logits))
        out.append(t)
        if t in eos:
            break
        llm.eval([t])
    return out, first


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for n, t in enumerate(tokens):
        if t in eos:
            return tokens[:n + 1]
    return tokens


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    return _child(json.loads(request_path.read_text()), result_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
