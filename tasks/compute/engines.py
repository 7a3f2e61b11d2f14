"""Which engine can serve which model on the node, and the node's worker command.

Each engine decides by the GGUF's `general.architecture` from its OWN list; this module reads
those lists from the engine's code as installed (the node builds its one environment from the
same pins as this machine's), so a pair the engine cannot load is refused before a GPU hour is
paid for:

- llama.cpp: `LLM_ARCH_NAMES` in src/llama-arch.cpp of the llama.cpp vendored in the pinned
  llama-cpp-python (0.3.36 today; `python -m tasks.training.convert install` unpacks that file
  from its source distribution beside the converters). It knows olmo, olmo2, olmoe: OLMo 3's
  GGUF (written as olmo2 by llama.cpp's converter) loads.
- vLLM: `vllm serve X.gguf` builds the model's config through transformers
  (vllm/transformers_utils/config.py passes `gguf_file=` to the config loader), whose
  modeling_gguf_pytorch_utils.load_gguf_checkpoint raises "GGUF model with architecture
  {arch} is not supported yet" for any architecture outside GGUF_SUPPORTED_ARCHITECTURES
  (the keys of transformers.integrations.ggml.GGUF_CONFIG_MAPPING) after a few renames
  (qwen2moe → qwen2_moe, …, copied below). The list read is the installed transformers' (5.24
  today: no olmo2, hence vllm-project/vllm#30691); vLLM uses the transformers of the same
  environment on the node.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from blocks.node_serve import NodeServeSettings
from tasks.engine.llama_cpp import INSTALL_HINT, tools_dir
from tasks.shared.errors import ConfigError

LLAMA_ARCH_FILE = "src/llama-arch.cpp"
# load_gguf_checkpoint's renames of llama.cpp names to transformers' (transformers 5.24,
# modeling_gguf_pytorch_utils.py): a GGUF is accepted when either name is in the list.
_TRANSFORMERS_RENAMES = {"qwen2moe": "qwen2_moe", "gpt-oss": "gpt_oss", "gpt_oss": "gpt_oss",
                         "qwen3moe": "qwen3_moe", "minimax-m2": "minimax_m2"}
# The dialect each engine's server understands (tasks/extraction/llm.py structured_output):
# for llama-server, a compact GBNF grammar of the schema (or json_object + schema with a
# reasoning budget); for vLLM, OpenAI's json_schema form.
DIALECTS = {"llama.cpp": "llama.cpp", "vllm": "vllm"}


def llama_arch_file() -> Path:
    return tools_dir() / LLAMA_ARCH_FILE


@cache
def _llama_names(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8")
    block = re.search(r"LLM_ARCH_NAMES\s*=\s*\{(.*?)\n\};", text, re.S)
    if block is None:
        raise ConfigError(f"{path} has no LLM_ARCH_NAMES table — the vendored llama.cpp's "
                          "layout changed; update tasks/compute/engines.py")
    return frozenset(re.findall(r'\{\s*LLM_ARCH_\w+\s*,\s*"([^"]+)"\s*\}', block.group(1)))


def llama_cpp_architectures() -> frozenset[str]:
    """GGUF architectures the pinned llama.cpp loads (ConfigError when the list is absent)."""
    path = llama_arch_file()
    if not path.is_file():
        raise ConfigError(f"llama.cpp's architecture list {path} is not installed, so the "
                          f"engine check cannot run — {INSTALL_HINT}")
    return _llama_names(path)


def vllm_architectures() -> frozenset[str]:
    """GGUF architectures vLLM's GGUF path accepts: transformers' GGUF_SUPPORTED_ARCHITECTURES."""
    try:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    except ImportError as e:
        raise ConfigError(f"transformers' GGUF table cannot be imported ({e}) — the engine "
                          "check for vllm needs the project's environment (run `make`)") from e
    return frozenset(k for k in GGUF_CONFIG_MAPPING if k not in {"general", "tokenizer"})


def _vllm_loads(arch: str, known: frozenset[str]) -> bool:
    return arch in known or _TRANSFORMERS_RENAMES.get(arch) in known


def engine_problems(settings: NodeServeSettings, dialect: str | None = None) -> list[str]:
    """Why the node's engine cannot serve its model (empty: it can), from the engine's own list
    of GGUF architectures; with `dialect` (the inference block's), also a dialect the engine's
    server does not speak. Each problem names the fix."""
    s = settings
    arch = s.model_architecture
    problems = []
    try:
        if s.engine == "llama.cpp":
            if arch not in llama_cpp_architectures():
                problems.append(
                    f"engine llama.cpp cannot load {s.model_path}: architecture {arch!r} is not "
                    f"in the pinned llama.cpp's list ({llama_arch_file()}) — serve a model of a "
                    "listed architecture, or fix [compute.node] model_architecture to the "
                    "GGUF's general.architecture")
        elif not _vllm_loads(arch, vllm_architectures()):
            import transformers

            alt = (f" — set [compute.node] engine = \"llama.cpp\" (it loads {arch})"
                   if arch in _safe_llama_names() else
                   " — serve a model of an architecture it lists, or fix model_architecture")
            problems.append(
                f"engine vllm cannot load {s.model_path}: its GGUF loader (transformers "
                f"{transformers.__version__}) has no architecture {arch!r} (\"GGUF model with "
                f"architecture {arch} is not supported yet\", vllm-project/vllm#30691){alt}")
    except ConfigError as e:
        problems.append(str(e))
    want = DIALECTS[s.engine]
    if dialect is not None and dialect != want:
        problems.append(f"engine {s.engine} needs the inference block's dialect {want!r}, not "
                        f"{dialect!r} (its structured-output request shape) — set [inference] "
                        f"dialect = \"{want}\"")
    return problems


def _safe_llama_names() -> frozenset[str]:
    try:
        return llama_cpp_architectures()
    except ConfigError:
        return frozenset()


def chat_template_on_node(settings: NodeServeSettings) -> str | None:
    """The node's path of llama-server's --chat-template-file: a relative chat_template_file is
    a file of the node's checkout ({project_dir}/<path>); None = the GGUF's own template."""
    path = settings.chat_template_file
    if not path:
        return None
    return path if path.startswith("/") else f"{settings.project_dir.rstrip('/')}/{path}"


def worker_command(settings: NodeServeSettings) -> list[str]:
    """The node's Prefect worker: the prefect of the node's one environment, so the flow runs it
    starts (`sys.executable -m prefect.engine`) have torch, peft and prefect-gcp."""
    return [settings.venv_bin("prefect"), "worker", "start", "--pool", settings.work_pool,
            "--type", "process"]
