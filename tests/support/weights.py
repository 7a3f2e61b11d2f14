"""The weights source the operator lays out (`slm-nightly weights prepare`): the names in it,
and the command's arguments."""

from __future__ import annotations

import argparse

REPO = "allenai/Olmo-3-7B-Think"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
GGUF_NAME = "Olmo-3-32B-Think-Q3_K_M.gguf"
BASE_GGUF = "olmo-3-7b-think-f16.gguf"


def weights_args(*argv: str) -> argparse.Namespace:
    from tasks.image.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))
