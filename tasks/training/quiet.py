"""Quiet third-party libraries while the project's own logs speak for them.

Below both tasks/training/base_model.py (dequantizing a GGUF) and tasks/training/train.py
(training), which each go quiet while they run.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """While training: no progress bars from datasets/transformers/huggingface_hub (the flow
    logs step, loss and peak memory itself), and Python warnings into logging (`py.warnings`)
    rather than printed — unless someone (the CLI's run log) already routes them."""
    import datasets
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    bars = [(datasets.is_progress_bar_enabled(), datasets.enable_progress_bars,
             datasets.disable_progress_bars),
            (hf_logging.is_progress_bar_enabled(), hf_logging.enable_progress_bar,
             hf_logging.disable_progress_bar),
            (not hub_utils.are_progress_bars_disabled(), hub_utils.enable_progress_bars,
             hub_utils.disable_progress_bars)]
    capture = getattr(warnings.showwarning, "__module__", "") != "logging"
    for _, _, off in bars:
        off()
    if capture:
        logging.captureWarnings(True)
    try:
        yield
    finally:
        if capture:
            logging.captureWarnings(False)
        for was_on, on, _ in bars:
            if was_on:
                on()
