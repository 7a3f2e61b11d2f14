"""The node image's model folder, built from a source and checked: what the old pipeline's
`vllm-weights-prep.sh` did, run once when the image is built (COMMAND), never at boot.

The source is a local folder or a `gs://bucket/folder` (read through tasks/gcs_sync.py with
application-default credentials); nothing comes from a hub. It holds, by name:

    SOURCE/<basename of model_path>            the 32B GGUF the engine serves
    SOURCE/<basename of tokenizer>/            its tokenizer folder (tokenizer.json, …)
    SOURCE/<name of base_model's repo>/        the training base as an HF folder, e.g.
                                               `hf download allenai/Olmo-3-7B-Think
                                               --local-dir SOURCE/Olmo-3-7B-Think`
    SOURCE/<basename of base_gguf>             the base's GGUF, when the recipe names one

and they land where the node reads them: the GGUF at `model_path`, the tokenizer at `tokenizer`,
the base in the Hugging Face cache layout under `hf_home` (hub/models--org--name/snapshots/
<commit>/ and refs/<revision>), so `from_pretrained(repo, local_files_only=True)` finds it with
HF_HUB_OFFLINE=1, and the base GGUF at `base_gguf`. The commit is the hub's, read from the
metadata `hf download --local-dir` leaves in SOURCE/<name>/.cache/huggingface, else the
revision when it is a commit hash, else a name derived from the file list.

Each file is copied to a temporary file beside its destination and renamed into place, so a
reader never sees half of one; a destination whose size and checksum already equal the
source's is kept (a second run copies nothing; an interrupted one resumes). The checksum is the
sha256 for a local source, and for a GCS object the checksum GCS itself keeps (md5, or crc32c
for composite objects, which have no md5), so an object is never downloaded just to compare.

Then it checks what it built, and `--check` only checks: every file's size and sha256 against
the manifest (`weights-manifest.json` beside the GGUF); the GGUF's magic, that its tensor data
is complete, and its `general.architecture` against the settings' model_architecture; the
tokenizer and the base's config loading in a child process with HF_HUB_OFFLINE=1 and
HF_HOME=hf_home, as the node loads them; the base's architecture against llama.cpp's converter
(tasks/training/convert.py), which must export the adapters trained on it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.errors import ConfigError
from tasks.files import write_atomic
from tasks.training.preflight import Check

MANIFEST = "weights-manifest.json"
COMMAND = "slm-nightly node prepare-weights"  # how the operator runs it (messages name it)
GGUF_MAGIC = b"GGUF"
_COMMIT = re.compile(r"[0-9a-f]{40}")
HF_METADATA = ".cache/huggingface/download"  # what `hf download --local-dir` leaves


class WeightsError(ConfigError):
    """The model folder is incomplete or wrong: raised with every failing check."""


@dataclass(frozen=True)
class WeightsLayout:
    """Where the node reads each piece (the node settings and the recipe)."""

    model_path: Path
    model_architecture: str
    tokenizer: Path
    hf_home: Path
    base_model: str  # org/name[@revision]
    base_gguf: Path | None = None

    @classmethod
    def from_settings(cls, settings: Any, base_model: str,
                      base_gguf: str | None = None) -> WeightsLayout:
        """From blocks/node_serve.py's NodeServeSettings (model_path, model_architecture,
        tokenizer, hf_home) and the recipe's base_model / base_gguf."""
        return cls(Path(settings.model_path), settings.model_architecture,
                   Path(settings.tokenizer), Path(settings.hf_home), base_model,
                   Path(base_gguf) if base_gguf else None)

    @property
    def repo(self) -> str:
        repo = self.base_model.partition("@")[0]
        if repo.count("/") != 1 or repo.endswith(".gguf"):
            raise ConfigError(f"base model {self.base_model!r}: the node's base must be a hub "
                              "id 'org/name@revision' (the recipe's base_model) to live in the "
                              "Hugging Face cache")
        return repo

    @property
    def revision(self) -> str:
        return self.base_model.partition("@")[2] or "main"

    @property
    def cache_repo_dir(self) -> Path:
        return self.hf_home / "hub" / ("models--" + self.repo.replace("/", "--"))

    @property
    def manifest_path(self) -> Path:
        return self.model_path.parent / MANIFEST


# --- sources ----------------------------------------------------------------------------------


class _Entry:
    """One source file: its size, whether a local file already equals it, and a copy."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size = url, size

    def same(self, dest: Path) -> bool:
        raise NotImplementedError

    def copy_to(self, tmp: Path) -> None:
        raise NotImplementedError

    def read_text(self) -> str:
        raise NotImplementedError


class _LocalEntry(_Entry):
    def __init__(self, path: Path) -> None:
        super().__init__(str(path), path.stat().st_size)
        self.path = path

    def same(self, dest: Path) -> bool:
        return dest.stat().st_size == self.size and _sha256(dest) == _sha256(self.path)

    def copy_to(self, tmp: Path) -> None:
        with self.path.open("rb") as src, tmp.open("wb") as out:
            while block := src.read(1 << 22):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())

    def read_text(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


class _GcsEntry(_Entry):
    def __init__(self, url: str, blob: Any) -> None:
        super().__init__(url, int(blob.size))
        self.blob = blob

    def same(self, dest: Path) -> bool:
        if dest.stat().st_size != self.size:
            return False
        if self.blob.md5_hash:
            return _b64(dest, hashlib.md5(usedforsecurity=False)) == self.blob.md5_hash
        import google_crc32c

        return _b64(dest, google_crc32c.Checksum()) == self.blob.crc32c

    def copy_to(self, tmp: Path) -> None:
        # google-cloud-storage checks the download against the object's md5/crc32c itself.
        self.blob.download_to_filename(str(tmp))

    def read_text(self) -> str:
        return str(self.blob.download_as_text())


def _files(source: str) -> tuple[str, dict[str, _Entry]]:
    """(what the source is, relative path → entry) for every file under the source."""
    if source.startswith("gs://"):
        from tasks.gcs_sync import GcsFolder, gcs_bucket_from_env_or_block, parse_bucket_url

        if not parse_bucket_url(source, where="--source")[1]:
            raise ConfigError(f"source {source}: name the folder that holds the weights, e.g. "
                              "gs://my-bucket/models")
        gcs = GcsFolder(gcs_bucket_from_env_or_block(source), "")
        try:
            blobs = gcs.list("")
        except Exception as e:  # noqa: BLE001 - google.api_core errors: name the bucket and fix
            raise ConfigError(f"source {source}: cannot list it ({type(e).__name__}: "
                              f"{str(e)[:300]}) — check the bucket name and that these "
                              "credentials may read it (roles/storage.objectViewer)") from e
        return source, {k: _GcsEntry(gcs.url(k), b) for k, b in blobs.items()}
    root = Path(source)
    if not root.is_dir():
        raise ConfigError(f"source {source}: not a folder — pass the folder (or "
                          "gs://bucket/folder) that holds the GGUF, the tokenizer folder and "
                          "the base model folder (docs/operator-gcp.md, section 3)")
    return str(root.resolve()), {p.relative_to(root).as_posix(): _LocalEntry(p)
                                 for p in sorted(root.rglob("*")) if p.is_file()}


def _under(files: dict[str, _Entry], sub: str) -> dict[str, _Entry]:
    """The files under `sub`/, by path relative to it, hidden ones (.cache, .git) left out."""
    out = {k[len(sub) + 1:]: e for k, e in files.items() if k.startswith(sub + "/")}
    return {k: e for k, e in out.items() if not any(p.startswith(".") for p in k.split("/"))}


# --- copying ----------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _b64(path: Path, h: Any) -> str:
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return base64.b64encode(h.digest()).decode()


def _place(entry: _Entry, dest: Path, log: Any) -> dict[str, Any]:
    """Copy one file into place (tmp + rename) unless an equal one is there already."""
    kept = dest.is_file() and entry.same(dest)
    if not kept:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        try:
            entry.copy_to(tmp)
            if tmp.stat().st_size != entry.size:
                raise WeightsError(f"{entry.url}: copied {tmp.stat().st_size} bytes of "
                                   f"{entry.size} — the disk at {dest.parent} may be full; "
                                   f"free space and run `{COMMAND}` again (it resumes)")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    log(f"{'kept  ' if kept else 'copied'} {dest} ({entry.size:,} bytes)")
    return {"path": str(dest), "size": entry.size, "sha256": _sha256(dest),
            "source": entry.url, "copied": not kept}


def _snapshot_name(layout: WeightsLayout, base: dict[str, _Entry],
                   files: dict[str, _Entry], sub: str) -> str:
    """The snapshot folder's name: the hub commit when the source knows it (module docstring)."""
    if _COMMIT.fullmatch(layout.revision):
        return layout.revision
    for key, entry in sorted(files.items()):
        if key.startswith(f"{sub}/{HF_METADATA}/") and key.endswith(".metadata"):
            first = entry.read_text().splitlines()[:1]
            if first and _COMMIT.fullmatch(first[0].strip()):
                return first[0].strip()
    listing = "\n".join(f"{k}\0{e.size}" for k, e in sorted(base.items()))
    return hashlib.sha1(f"{layout.base_model}\n{listing}".encode(),
                        usedforsecurity=False).hexdigest()


def prepare_weights(source: str | Path, layout: WeightsLayout,
                    log: Any = print) -> dict[str, Any]:
    """Build the model folder from `source` (module docstring), check it, and write its
    manifest. Returns the manifest; raises WeightsError with every failing check."""
    src, files = _files(str(source))
    base_sub = layout.repo.split("/")[1]
    tok, base = _under(files, layout.tokenizer.name), _under(files, base_sub)
    missing = [f"{what}: {src}/{name}" for what, name, there in [
        ("the GGUF (model_path)", layout.model_path.name, layout.model_path.name in files),
        ("the tokenizer folder (tokenizer)", layout.tokenizer.name + "/", bool(tok)),
        (f"the training base {layout.repo} (an HF folder)", base_sub + "/", bool(base)),
        ("the base's GGUF (the recipe's base_gguf)", layout.base_gguf.name if layout.base_gguf
         else "", not layout.base_gguf or layout.base_gguf.name in files)] if not there]
    if base and "config.json" not in base:
        missing.append(f"the base's config.json: {src}/{base_sub}/config.json")
    if missing:
        raise ConfigError(f"source {src} lacks " + "; ".join(missing) + " — put them there "
                           "under these names (docs/operator-gcp.md, section 3), or fix "
                           "[compute.node] model_path / tokenizer and the recipe's base_model / "
                           "base_gguf")
    snapshot = layout.cache_repo_dir / "snapshots" / _snapshot_name(layout, base, files,
                                                                     base_sub)
    copied: dict[str, Any] = {
        "model": _place(files[layout.model_path.name], layout.model_path, log),
        "tokenizer": [_place(e, layout.tokenizer / k, log) for k, e in sorted(tok.items())],
        "base": [_place(e, snapshot / k, log) for k, e in sorted(base.items())]}
    if layout.base_gguf:
        copied["base_gguf"] = _place(files[layout.base_gguf.name], layout.base_gguf, log)
    if not _COMMIT.fullmatch(layout.revision):  # written last: until then the cache has no base
        write_atomic(layout.cache_repo_dir / "refs" / layout.revision, snapshot.name)
    checks = run_checks(layout)
    failed = [c for c in checks if c.failed]
    for c in checks:
        log(c.line())
    if failed:
        raise WeightsError(f"the model folder built from {src} fails {len(failed)} check(s): "
                           + "; ".join(c.line() for c in failed))
    manifest = {"schema": 1, "prepared_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "source": src, "layout": _layout_dict(layout), "snapshot": str(snapshot),
                "files": copied, "checks": [c.__dict__ for c in checks]}
    write_atomic(layout.manifest_path, json.dumps(manifest, indent=1) + "\n")
    log(f"manifest: {layout.manifest_path}")
    return manifest


def _layout_dict(layout: WeightsLayout) -> dict[str, str | None]:
    return {"model_path": str(layout.model_path), "model_architecture":
            layout.model_architecture, "tokenizer": str(layout.tokenizer), "hf_home":
            str(layout.hf_home), "base_model": layout.base_model,
            "base_gguf": str(layout.base_gguf) if layout.base_gguf else None}


# --- checks -----------------------------------------------------------------------------------


def check_weights(layout: WeightsLayout) -> list[Check]:
    """`--check`: every file the manifest records against its size and sha256, then
    run_checks. Nothing is copied or written."""
    path = layout.manifest_path
    if not path.is_file():
        return [Check("manifest", "failed", f"{path} not found — build the folder with "
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
        elif _sha256(p) != r["sha256"]:
            bad.append(f"{p}: sha256 differs from the manifest's")
    files = Check("files", "failed", "; ".join(bad) + f" — run `{COMMAND}` again (it copies only "
                  "what differs)") if bad else Check(
        "files", "ok", f"{len(records)} files match {path} (size and sha256)")
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
        return Check(name, "failed", f"{path} not found — run `{COMMAND}`")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        return Check(name, "failed", f"{path} is not a GGUF file (starts with {magic!r}, not "
                     "b'GGUF') — the source holds something else under that name")
    size = path.stat().st_size
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
        arch = reader.fields["general.architecture"].contents()
    except (ValueError, IndexError, KeyError, OSError) as e:
        return Check(name, "failed", f"{path} ({size:,} bytes) is damaged or truncated "
                     f"({type(e).__name__}: {str(e)[:150]}) — copy it again: delete it and "
                     f"run `{COMMAND}` (it resumes)")
    if end > size:
        return Check(name, "failed", f"{path} is truncated: its tensors end at byte {end:,}, "
                     f"the file has {size:,} — delete it and run `{COMMAND}`")
    if architecture is not None and arch != architecture:
        return Check(name, "failed", f"{path}: general.architecture is {arch!r}, the node "
                     f"settings' {setting} is {architecture!r} — copy the model the node "
                     f"serves (OLMo 3 GGUFs say 'olmo2'), or set [compute.node] {setting} to "
                     "the file's if the engine loads it")
    return Check(name, "ok", f"{path}: {arch}, {len(reader.tensors)} tensors, {size:,} bytes")


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
        return {"tokenizer": Check("tokenizer", "failed", why),
                "base": Check("base model", "failed", why)}
    tok, base = got["tokenizer"], got["base"]
    return {
        "tokenizer": Check("tokenizer", "ok", f"{layout.tokenizer} loads offline: {tok['ok']}")
        if "ok" in tok else Check("tokenizer", "failed", f"{layout.tokenizer} does not load "
                                  f"with HF_HUB_OFFLINE=1: {tok['error']} — the folder needs "
                                  "the tokenizer files (tokenizer.json, tokenizer_config.json); "
                                  "copy the model repo's into the source's tokenizer folder"),
        "base": Check("base model", "ok", f"{layout.base_model} loads offline from "
                      f"HF_HOME={layout.hf_home}: {base['ok']}")
        if "ok" in base else Check("base model", "failed", f"{layout.base_model} does not load "
                                   f"with HF_HOME={layout.hf_home} HF_HUB_OFFLINE=1: "
                                   f"{base['error']} — run `{COMMAND}` with the base's HF "
                                   "folder in the source"),
        "config": base.get("config")}


def _converter_check(config: dict[str, Any], repo: str) -> Check:
    from tasks.training import convert

    arch = convert.hf_architecture(config)
    try:
        known = convert.supported_architectures()
    except ConfigError as e:
        return Check("converter", "failed", str(e))
    if arch not in known:
        return Check("converter", "failed", f"{repo} is {arch or 'without architectures'}, "
                     "which llama.cpp's converter cannot export adapters for — train on a base "
                     "the converter supports (`python -m tasks.training.convert` lists them)")
    return Check("converter", "ok", f"{arch}: llama.cpp's converter exports its adapters")


# --- the command ------------------------------------------------------------------------------


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
    from blocks.node_serve import NodeServeSettings
    from tasks.profile import profile_path
    from tasks.training.params import read_recipe

    path = profile_path(profile)
    if not path.is_file():
        raise ConfigError(f"profile {profile}: {path} not found — pass --profile NAME or a path")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    compute = data.get("compute") or {}
    if "block" in compute:
        settings = _saved_node_settings(path, compute)
    else:
        if "vllm" in compute and "node" not in compute:
            raise ConfigError(f"profile {path}: [compute.vllm] is now [compute.node] — rename "
                              "the table (its model_path and tokenizer keep their names)")
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
    from prefect.settings import PREFECT_API_URL

    from tasks.profile import _build

    if not PREFECT_API_URL.value():  # Prefect would start a temporary server without the block
        raise ConfigError(f"profile {path}: [compute] is the saved block {compute['block']!r} "
                          f"and PREFECT_API_URL is not set — set PREFECT_API_URL to the server "
                          f"it is saved on (under sudo: `sudo env PREFECT_API_URL=… {COMMAND} "
                          "…`), or write the [compute.node] keys in the profile")
    block = _build(path, "compute", compute)
    settings = getattr(block, "node", None)
    if settings is None:
        raise ConfigError(f"profile {path}: [compute] is the saved block {compute['block']!r}, "
                          f"a {type(block).__name__} with no node settings — {COMMAND} builds "
                          "a GCE node's model folder: name a saved GceCompute block "
                          "(type = \"gce\")")
    return settings


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
            print(json.dumps([c.__dict__ for c in checks], indent=1))
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

