"""Profiles: one TOML file that builds every block (local runs need no Prefect server), or
names saved blocks to load (production).

    [graph]
    type = "neo4j"
    block = "prod-graph"      # load the saved block 'prod-graph' instead of inline fields

Where things are, from any working directory:
- a name (`--profile local`) is profiles/NAME.toml in the project (PROFILE_DIR, found from
  this file, not the working directory); anything ending in .toml or holding a `/` is a path
  (relative ones to the working directory, like any command-line path);
- relative paths *inside* a profile (state_dir, [compute] state_dir and model_path, [graph]
  data_dir, [sources] folders, [corpus] root, [training] artifact_store and model_cache) are
  relative to the project root (PROJECT_ROOT, the folder that holds profiles/), whichever
  profile file names them, so a run started from another folder reads and writes the same
  files. Paths on the GPU node ([compute.node]) and saved blocks are taken as they are, but a
  saved compute block whose state_dir is the field's default uses the profile's state_dir.

Each profile keeps its own state_dir (local: .slm-nightly, gcp: .slm-nightly-gcp), so a local
run's records never mix with production's. A section with `block` holds nothing else but
`type`: any other key would be ignored, so it is refused (put the field in the saved block).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from prefect.blocks.core import Block
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from blocks.compute import LocalCompute
from blocks.gce import GceCompute
from blocks.graph import GraphBlock
from blocks.inference import InferenceEndpoint
from blocks.serving import ServingEndpoint
from blocks.sources import DocumentSources
from tasks.compute.protocol import Node, nodes_for
from tasks.corpus.scorecard import ScorecardConfig
from tasks.extraction.inputs import source_roots
from tasks.extraction.setup import Phase1Setup, ask_for
from tasks.extraction.streams import STREAMS
from tasks.graph.ontology import DEFAULT_SCHEMA, GraphSchema, load_schema
from tasks.graph.snapshots import SnapshotConfig
from tasks.shared.errors import ConfigError, explain_validation
from tasks.shared.gcs_sync import env_bucket, parse_bucket_url
from tasks.shared.paths import PROJECT_ROOT
from tasks.training.registry import ArtifactStore

DEFAULT_SCHEMA_NAME = str(DEFAULT_SCHEMA.relative_to(DEFAULT_SCHEMA.parents[1]))  # schemas/…

PROFILE_DIR = PROJECT_ROOT / "profiles"

# Inline fields that name a path on this machine, per section (see the module docstring).
_PATH_FIELDS: dict[str, tuple[str, ...]] = {
    "compute": ("state_dir", "model_path"),
    "graph": ("data_dir",),
    "sources": tuple(s.source_field for s in STREAMS if s.source_field),  # each stream's field
    "corpus": ("root",),
    "extraction": ("schema",),
    "training": ("artifact_store", "model_cache"),
}


def project_path(value: str) -> str:
    """`value` as an absolute path: a relative one is taken from the project root."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else PROJECT_ROOT / path)


def _with_project_paths(section: str, table: dict[str, Any]) -> dict[str, Any]:
    if "block" in table:  # a saved block keeps the paths it was saved with
        return table
    out = dict(table)
    for key in _PATH_FIELDS.get(section, ()):
        if isinstance(out.get(key), str) and out[key]:
            out[key] = project_path(out[key])
    if section == "sources" and isinstance(out.get("other"), dict):  # name → folder
        out["other"] = {k: project_path(v) if isinstance(v, str) and v else v
                        for k, v in out["other"].items()}
    return out


class ExtractionSettings(BaseModel):
    """Phase-1 settings that are not a block."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    max_failed_share: float = Field(default=0.2, ge=0.0, le=1.0,
                                    description="Phase 1 fails above this share of failed documents.")
    batch_documents: int = Field(default=64, ge=1, le=100_000,
                                 description="Documents per Prefect task (extract + upsert).")
    schema_file: str = Field(default=DEFAULT_SCHEMA_NAME, alias="schema",
                             description="The graph schema (TOML): node and relationship "
                             "types, allowed patterns, prompt examples. Relative paths are "
                             "from the project root.")
    gleanings: int = Field(default=0, ge=0, le=3,
                           description="Extra passes per chunk asking the model what it "
                           "missed (0 = none); each costs about one more request.")
    judge: bool = Field(default=False,
                        description="A name alone that several Persons of that name hold, "
                        "which its document's evidence does not settle, goes to the serving "
                        "model: it gives its reasons, then one of them or none "
                        "(tasks/extraction/judge.py); a link it makes is recorded like any "
                        "other join. Off: such a name is linked to none and listed.")

    def ontology(self) -> GraphSchema:
        """The graph schema this profile names (ConfigError naming the file and the fix)."""
        return load_schema(project_path(self.schema_file))


class CorpusSettings(ScorecardConfig):
    """Phase 2a: where the training corpus is, and (ScorecardConfig's fields) what a bucket
    needs to pass."""

    root: str | None = Field(default=None, description="Corpus root; empty = no phase 2.")
    engineering_bucket: str = Field(default="engineering-pointsav", description="SFT bucket.")
    apprenticeship_bucket: str = Field(default="apprenticeship-pointsav", description="DPO bucket.")
    gcs_block: str | None = Field(default=None, description="Saved GcsBucket block (or "
                                  "gs://bucket[/folder]) to sync the corpus to; empty = the "
                                  "profile's gcs_block, else $SLM_YOYO_WEIGHTS_GCS_BUCKET, else "
                                  "no sync.")

    def buckets(self) -> dict[str, Literal["sft", "dpo"]]:
        return {self.engineering_bucket: "sft", self.apprenticeship_bucket: "dpo"}


class TrainingSettings(BaseModel):
    """Phase 2b: how a passing bucket is trained, where adapters go, when one is promoted."""

    model_config = ConfigDict(extra="forbid")
    recipe: str = Field(default="local", description="recipes/NAME.yaml or a path.")
    base_model: str | None = Field(default=None, description="Overrides the recipe's base "
                                   "model; empty = the recipe's, else the GGUF the server serves.")
    artifact_store: str | None = Field(default=None, description="Adapters, manifests, "
                                       "checkpoints (a local folder; a cache of GCS when "
                                       "gcs_block names a bucket); empty = "
                                       "<state_dir>/artifacts.")
    gcs_block: str | None = Field(default=None, description="Saved GcsBucket block (or "
                                  "gs://bucket[/folder]) that holds the artifact store's truth "
                                  "(the local folder is then a cache); empty = the profile's "
                                  "gcs_block, else $SLM_YOYO_WEIGHTS_GCS_BUCKET, else local only.")
    model_cache: str | None = Field(default=None, description="Base models dequantized from "
                                    "GGUF (HF folders) and F32 copies; empty = <state_dir>/models.")
    promote_margin: float = Field(default=0.0, ge=0, lt=1, description="The new adapter's eval "
                                  "loss must be this fraction below the base's and the promoted "
                                  "adapter's.")
    serve_bucket: str | None = Field(default="engineering-pointsav", description="Whose promoted "
                                     "adapter the inference server loads (empty: none).")
    timeout_seconds: int = Field(default=7200, ge=1, description="Phase-2 timeout per run.")
    node_deployment: str = Field(default="train/node", description="With a GCE node: the "
                                 "deployment (on the node's work pool) the nightly runs "
                                 "training through; the node's own worker picks it up.")
    node_pickup_seconds: int = Field(default=600, ge=1, description="With a GCE node: fail "
                                     "training when no worker on the node's pool has taken "
                                     "the run after this long (the node's worker is not up).")
    enabled: bool = Field(default=True, description="false: score only, never train.")
    node_ram_gib: float | None = Field(default=None, gt=0, description="RAM of the machine that "
                                       "trains (preflight checks verification fits it); empty: "
                                       "16 for a GCE node (g2-standard-4), else this machine's.")
    node_vram_gib: float | None = Field(default=None, ge=0, description="GPU memory of that "
                                        "machine; empty: 22.5 (an L4) for a GCE node, else this "
                                        "machine's CUDA device (0 without one).")


_KINDS: dict[str, dict[str, type[Block]]] = {
    "compute": {"local": LocalCompute, "gce": GceCompute},
    "inference": {"openai": InferenceEndpoint},
    "graph": {b.kind: b for b in get_args(GraphBlock)},
    "sources": {"folders": DocumentSources},
    # optional: where promoted adapters are served by name (tasks/training/serving.py)
    "serving": {"endpoint": ServingEndpoint},
}


@dataclass
class Profile:
    name: str
    path: Path
    state_dir: Path
    compute: LocalCompute | GceCompute
    inference: InferenceEndpoint
    graph: GraphBlock
    sources: DocumentSources
    extraction: ExtractionSettings
    corpus: CorpusSettings
    training: TrainingSettings
    gcs_block: str | None = None  # run records (summaries, scorecards, dead letters) go here
    serving: ServingEndpoint | None = None  # no [serving] section: no endpoint to publish to

    @cached_property
    def nodes(self) -> list[Node]:
        """Every node the compute block describes, the primary first (tasks/compute/protocol.py
        nodes_for): what boots, serves phase 1 and stops."""
        return nodes_for(self.compute)

    @property
    def node(self) -> Node:
        """The primary node (nodes[0]): where training runs, and the only one of a local
        profile."""
        return self.nodes[0]

    def snapshot_root(self) -> Path:
        """The artifact store that keeps graph snapshots (graph-snapshots/<name>/)."""
        return Path(self.training.artifact_store or self.state_dir / "artifacts")

    def artifact_store(self) -> ArtifactStore:
        """The adapter registry at [training] artifact_store, with GCS as its truth when
        [training] gcs_block names a bucket (tasks/training/registry.py)."""
        return ArtifactStore(self.snapshot_root(), self.training.gcs_block)

    def snapshot_gcs_block(self) -> str | None:
        return self.gcs_block or self.training.gcs_block

    def phase1(self, named: str, max_failed_share: float | None = None) -> Phase1Setup:
        """Phase 1's setup from this profile (tasks/extraction/setup.py), `named` as the run
        named it (a name or a path, for the commands its messages suggest); `max_failed_share`
        overrides [extraction] max_failed_share."""
        ex, ontology = self.extraction, self.extraction.ontology()
        return Phase1Setup(
            profile=named, endpoint=self.inference,
            ask=ask_for(self.inference, ontology, ex.gleanings, ex.judge),
            roots=source_roots(self.sources), max_bytes=int(self.sources.max_document_mb * 1e6),
            batch_documents=ex.batch_documents,
            max_failed_share=ex.max_failed_share if max_failed_share is None
            else max_failed_share,
            state_dir=self.state_dir, graph=self.graph, snapshots=self.snapshot_config(),
            server_exit=self.node.server_exit)

    def snapshot_config(self) -> SnapshotConfig:
        """Where this profile's graph snapshots are kept (tasks/graph/snapshots.py)."""
        return SnapshotConfig(self.snapshot_root(), self.graph.describe(),
                              self.graph.snapshots_to_keep(), self.snapshot_gcs_block())


def profile_path(ref: str) -> Path:
    if ref.endswith(".toml") or "/" in ref:
        return Path(ref)
    return PROFILE_DIR / f"{ref}.toml"


def _explain(path: Path, section: str, err: ValidationError) -> str:
    return explain_validation(err, f"profile {path}: invalid [{section}]:",
                              f"Fix the field in {path} (or in the saved block it names).")


def _build(path: Path, section: str, table: dict[str, Any]) -> Any:
    table = dict(table)
    kinds = _KINDS[section]
    kind = table.pop("type", next(iter(kinds)))
    if kind not in kinds:
        raise ConfigError(f"profile {path}: [{section}] type {kind!r} is not one of "
                          f"{sorted(kinds)} — fix 'type'")
    cls = kinds[kind]
    if "block" in table:
        name = table.pop("block")
        if table:  # the saved block is the whole section: inline keys beside it would be lost
            raise ConfigError(f"profile {path}: [{section}] loads the saved block "
                              f"'{cls.get_block_type_slug()}/{name}' and would ignore its other "
                              f"key(s) {sorted(table)} — put those fields in the saved block, "
                              f"or remove `block` to build [{section}] from the inline keys")
        try:
            return cls.load(name)
        except (ValueError, RuntimeError) as e:
            raise ConfigError(f"profile {path}: [{section}] saved block "
                              f"'{cls.get_block_type_slug()}/{name}' could not be loaded "
                              f"({e}) — create it (docs/operator-gcp.md: blocks and secrets) "
                              "or fix 'block'") from e
    if section == "compute":
        refuse_renamed(path, table)
    if section == "compute" and "nodes" in table and "nodes" not in cls.model_fields:
        # a compute block without `nodes` is one machine: 1 is allowed, for symmetry
        if table.pop("nodes") != 1:
            raise ConfigError(f"profile {path}: [compute] nodes > 1 needs GCE nodes: the local "
                              "compute is this one machine — use a GCE profile ([compute] "
                              "type = \"gce\") or drop `nodes`")
    unknown = sorted(set(table) - set(cls.model_fields))
    if unknown:
        raise ConfigError(f"profile {path}: [{section}] unknown field(s) {unknown}; "
                          f"valid fields: {sorted(f for f in cls.model_fields if not f.startswith('_'))}")
    try:
        return cls(**table)
    except ValidationError as e:
        raise ConfigError(_explain(path, section, e)) from None


def read_profile(ref: str) -> tuple[Path, dict[str, Any]]:
    """A profile's file and its TOML as they are, before any block is built (ConfigError
    naming the file and the fix): what load_profile reads, for the commands that need only
    some of it (the image builder, the preflight's first look)."""
    path = profile_path(ref)
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.toml")) if PROFILE_DIR.is_dir() else []
        raise ConfigError(f"profile {ref!r}: {path.resolve()} not found — pass a path to a .toml "
                          f"file or one of {known} (the names in {PROFILE_DIR})")
    try:
        return path, tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"profile {path}: not valid TOML ({e}) — fix the syntax") from e


def refuse_renamed(path: Path, compute: dict[str, Any]) -> None:
    """The one check for the [compute] table's old name."""
    if "vllm" in compute:
        raise ConfigError(f"profile {path}: [compute.vllm] is now [compute.node] (the node's "
                          "engine is a choice: llama.cpp or vLLM) — rename the table, and "
                          "drop prefect_bin/vllm_bin if set (set project_dir instead)")


_IN_USE: dict[str, Profile] = {}  # profile_in_use's, by the reference it was loaded by


@contextmanager
def profile_in_use(ref: str, cfg: Profile) -> Iterator[Profile]:
    """While the block runs, load_profile(ref) in this process returns `cfg`: the flows a
    night runs as subflows share the profile the night loaded, once (a deployment's run of
    the same flow loads it by name)."""
    before = _IN_USE.get(ref)
    _IN_USE[ref] = cfg
    try:
        yield cfg
    finally:
        if before is None:
            _IN_USE.pop(ref, None)
        else:
            _IN_USE[ref] = before


def load_profile(ref: str) -> Profile:
    """Build the blocks a run needs from a profile name (profiles/NAME.toml) or path (inside
    profile_in_use: the profile in use under that reference)."""
    if ref in _IN_USE:
        return _IN_USE[ref]
    path, data = read_profile(ref)
    unknown = sorted(set(data) - {*_KINDS, "extraction", "corpus", "training", "state_dir",
                                  "gcs_block", "gcp"})
    if unknown:
        raise ConfigError(f"profile {path}: unknown section(s) {unknown}")
    data = {k: _with_project_paths(k, v) if isinstance(v, dict) else v for k, v in data.items()}
    try:
        extraction = ExtractionSettings(**data.get("extraction", {}))
    except ValidationError as e:
        raise ConfigError(_explain(path, "extraction", e)) from None
    extraction.ontology()  # a bad schema file is the profile's error, said before any work
    try:
        corpus = CorpusSettings(**data.get("corpus", {}))
    except ValidationError as e:
        raise ConfigError(_explain(path, "corpus", e)) from None
    try:
        training = TrainingSettings(**data.get("training", {}))
    except ValidationError as e:
        raise ConfigError(_explain(path, "training", e)) from None
    state_dir = project_path(str(data.get("state_dir", ".slm-nightly")))
    gcs_block: str | None = data.get("gcs_block") or None
    if gcs_block is not None and not isinstance(gcs_block, str):
        raise ConfigError(f"profile {path}: gcs_block must be the name of a saved GcsBucket "
                          f"block (a string), got {gcs_block!r}")
    for named in (gcs_block, training.gcs_block, corpus.gcs_block):
        if named and named.startswith("gs://"):
            parse_bucket_url(named, where=f"profile {path}: gcs_block")
    gcs_block = gcs_block or env_bucket()  # the operators' variable names the bucket otherwise
    # one bucket for everything unless a section names its own
    training.gcs_block = training.gcs_block or gcs_block
    corpus.gcs_block = corpus.gcs_block or gcs_block
    if training.artifact_store is None:
        training.artifact_store = str(Path(state_dir) / "artifacts")
    compute_table = dict(data.get("compute", {}))
    if "block" not in compute_table:
        compute_table.setdefault("state_dir", state_dir)
    compute = _build(path, "compute", compute_table)
    if "block" in compute_table and \
            compute.state_dir == type(compute).model_fields["state_dir"].default:
        # a saved block left at the default keeps its records in the profile's state, so that
        # each profile's (local, gcp) stay apart
        compute = compute.model_copy(update={"state_dir": state_dir})
    inference = _build(path, "inference", data.get("inference", {}))
    nodes = len(nodes_for(compute))
    if nodes > 1 and inference.base_url:
        # each node serves phase 1 at its own address; one fixed URL would send all N's work
        # to a single server
        raise ConfigError(f"profile {path}: [compute] nodes = {nodes} with [inference] "
                          f"base_url {inference.base_url!r} — drop base_url (each node's own "
                          "address is used) or set nodes = 1")
    return Profile(
        name=path.stem,
        path=path,
        state_dir=Path(state_dir),
        compute=compute,
        inference=inference,
        graph=_build(path, "graph", data.get("graph", {})),
        sources=_build(path, "sources", data.get("sources", {})),
        extraction=extraction,
        corpus=corpus,
        training=training,
        gcs_block=gcs_block,
        serving=_build(path, "serving", data["serving"]) if "serving" in data else None,
    )
