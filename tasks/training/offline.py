"""bitsandbytes without the hub.

`import peft` imports bitsandbytes (peft/helpers.py), and bitsandbytes 0.50's CPU backend asks
the Hugging Face hub at import for a kernel on a CPU with AVX512-BF16
(bitsandbytes/backends/cpu/ops.py: `kernels.get_kernel("kernels-community/quantization-
bitsandbytes")`, a request to huggingface.co, falling back to its own code when that fails).
The project's models and code come from local paths only, so it imports bitsandbytes with the
hub off first.
"""

from __future__ import annotations

import sys


def import_bitsandbytes_offline() -> None:
    """Import bitsandbytes, once, with huggingface_hub's offline switch on for that import only.
    kernels reads the switch at the call (kernels/_internals/load.py: `constants.HF_HUB_OFFLINE`),
    so no request leaves, and no environment variable changes: a child process (an `hf
    download`) keeps its own."""
    if "bitsandbytes" in sys.modules:
        return
    from huggingface_hub import constants

    was, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        import bitsandbytes  # noqa: F401
    finally:
        constants.HF_HUB_OFFLINE = was
