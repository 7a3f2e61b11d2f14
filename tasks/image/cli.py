"""`slm-nightly node prepare-weights`: build the node image's model folder from a source, or
`--check` the one built (tasks/image/weights.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prefect.settings import PREFECT_API_URL

from blocks.node_serve import NodeServeSettings
from tasks.image.checks import as_record, check_weights
from tasks.image.layout import COMMAND, WeightsError, WeightsLayout
from tasks.image.weights import prepare_weights
from tasks.profile import _build, read_profile, refuse_renamed
from tasks.shared.errors import ConfigError
from tasks.training.params import read_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `slm-nightly node prepare-weights` (flows/cli.py)."""
    parser.add_argument("--source", help="local folder or gs://bucket/folder holding the GGUF, "
                        "the tokenizer folder and the base model folder (not with --check)")
    parser.add_argument("--check", action="store_true", help="only check the folder already "
                        "built (the manifest's sizes and sha256, the GGUF, offline loads)")
    parser.add_argument("--profile", default="gcp", help="profiles/NAME.toml or a path: "
                        "[compute.node] paths and the [training] recipe's base_model")
    parser.add_argument("--model-path", help="override [compute.node] model_path")
    parser.add_argument("--architecture", help="override [compute.node] model_architecture")
    parser.add_argument("--tokenizer", help="override [compute.node] tokenizer")
    parser.add_argument("--hf-home", help="override [compute.node] hf_home")
    parser.add_argument("--base-model", help="override the recipe's base_model (org/name@rev)")
    parser.add_argument("--base-gguf", help="override the recipe's base_gguf ('' = none)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def layout_from_profile(profile: str) -> tuple[Any, str, str | None]:
    """(node settings, base_model, base_gguf) read from a profile's TOML and its recipe: with
    inline [compute.node] keys the files only, so no Prefect API is needed on the machine
    building the image; with `[compute] block = "NAME"` the node settings are the saved
    GceCompute block's (`node`), loaded from the server PREFECT_API_URL names."""
    path, data = read_profile(profile)
    compute = data.get("compute") or {}
    if "block" in compute:
        settings = _saved_node_settings(path, compute)
    else:
        refuse_renamed(path, compute)
        table = compute.get("node") or {}
        try:
            settings = NodeServeSettings(**table)
        except ValueError as e:
            raise ConfigError(f"profile {path}: [compute.node]: {e}") from e
    training = data.get("training") or {}
    recipe = read_recipe(training.get("recipe", "local"))[1]
    base = training.get("base_model") or recipe.get("base_model") or ""
    return settings, str(base), recipe.get("base_gguf")


def _saved_node_settings(path: Path, compute: dict[str, Any]) -> Any:
    """The `node` settings of the saved compute block [compute] names (the profile loader's
    rules: `type` picks the block type, no other key may stand beside `block`)."""
    if not PREFECT_API_URL.value():  # Prefect would start a temporary server without the block
        raise ConfigError(f"profile {path}: [compute] is the saved block {compute['block']!r} "
                          f"and PREFECT_API_URL is not set — set PREFECT_API_URL to the server "
                          f"it is saved on (under sudo: `sudo env PREFECT_API_URL=… {COMMAND} "
                          "…`), or write the [compute.node] keys in the profile")
    if compute.get("type", "local") == "local":  # the loader's default kind has no node
        raise ConfigError(f"profile {path}: [compute] is the saved block {compute['block']!r}, "
                          f"a LocalCompute with no node settings — {COMMAND} builds "
                          "a GCE node's model folder: name a saved GceCompute block "
                          "(type = \"gce\")")
    return _build(path, "compute", compute).node


def cli_main(args: argparse.Namespace) -> int:
    """Run the command: 0 when every check passed, 1 when one failed (ConfigError on bad
    input, which the CLI prints)."""
    settings, base, base_gguf = layout_from_profile(args.profile)
    if args.base_gguf is not None:
        base_gguf = args.base_gguf or None
    layout = WeightsLayout(
        Path(args.model_path or settings.model_path),
        args.architecture or settings.model_architecture,
        Path(args.tokenizer or settings.tokenizer), Path(args.hf_home or settings.hf_home),
        args.base_model or base, Path(base_gguf) if base_gguf else None)
    _ = layout.repo  # a base that is not a hub id is refused before anything is copied
    quiet = (lambda _line: None) if args.json else print
    if args.check:
        checks = check_weights(layout)
        if args.json:
            print(json.dumps([as_record(c) for c in checks], indent=1))
        else:
            for c in checks:
                print(c.line())
        return 1 if any(c.failed for c in checks) else 0
    if not args.source:
        raise ConfigError(f"{COMMAND} needs --source DIR or gs://bucket/folder (or "
                          "--check to check a folder already built)")
    try:
        manifest = prepare_weights(args.source, layout, log=quiet)
    except WeightsError as e:
        print(f"slm-nightly: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(manifest, indent=1))
    return 0

