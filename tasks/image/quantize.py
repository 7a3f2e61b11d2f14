"""`python -m tasks.image.quantize SRC DST TYPE`: a GGUF quantized by llama.cpp's own
llama_model_quantize, through the pinned llama-cpp-python (the library `tasks.engine.llama_build check`
evaluates), as the image builder runs it: the f16 GGUF of the 32B into the type the node serves.
TYPE is a llama.cpp file type name after LLAMA_FTYPE_MOSTLY_ (Q3_K_M, Q4_K_M, Q8_0, …)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

from tasks.shared.errors import ConfigError


def ftype(name: str) -> int:
    import llama_cpp

    value = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name.upper()}", None)
    if not isinstance(value, int):
        known = sorted(k.removeprefix("LLAMA_FTYPE_MOSTLY_") for k in dir(llama_cpp)
                       if k.startswith("LLAMA_FTYPE_MOSTLY_"))
        raise ConfigError(f"quantization type {name!r}: not one of llama.cpp's "
                          f"({', '.join(known)})")
    return value


def quantize(src: Path, dst: Path, type_name: str, threads: int = 0) -> None:
    """Write `dst`, `src` quantized to `type_name`, through a temporary file renamed into place
    (an interrupted run leaves no GGUF that looks whole)."""
    import llama_cpp

    if not src.is_file():
        raise ConfigError(f"quantize: {src} is not a file — convert the model to a GGUF first")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype(type_name)
    params.nthread = threads
    part = dst.with_name(dst.name + ".part")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        part.unlink(missing_ok=True)
        raise ConfigError(f"quantize {src} → {type_name}: llama_model_quantize returned {rc}")
    part.replace(dst)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        quantize(Path(argv[0]), Path(argv[1]), argv[2])
    except ConfigError as e:
        print(f"slm-nightly: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
