"""Nothing asks the Hugging Face hub at run time: bitsandbytes 0.50, which `import peft` and
TRL's configs load, asks the hub at its import for a CPU kernel on a CPU with AVX512-BF16
(tasks/training/offline.py). Here the hub is tests/fakes/hf_hub.py at HF_ENDPOINT, which
records each request; the project's training imports go through import_bitsandbytes_offline()."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fakes.hf_hub import FakeHub
from tests.support.paths import ROOT

PLAIN = "import peft"
# what the training code does: its recipe's PEFT and TRL configs (the first import of both),
# then the model's PEFT
PROJECT = """
import os
from tasks.training.params import _fields
_fields()
import peft
assert os.environ.get("HF_HUB_OFFLINE") is None  # nothing a child process would inherit
from huggingface_hub import constants
assert constants.HF_HUB_OFFLINE is False  # and the switch is back as it was
"""


def requests_made(code: str) -> list[str]:
    """The hub requests a child running `code` makes, with the hub online to it."""
    with FakeHub({}) as hub:
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env |= {"HF_ENDPOINT": hub.url, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        return list(hub.requests)


def test_the_training_imports_ask_the_hub_nothing() -> None:
    plain = requests_made(PLAIN)
    if not plain:
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes asks the hub nothing here, "
                    "so nothing shows the difference")
    # bitsandbytes' kernel lookup (kernels' publisher check, then the kernel's files)
    assert any("kernels-community" in r for r in plain), plain
    assert requests_made(PROJECT) == []
