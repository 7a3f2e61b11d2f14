"""The night's preflight, the orchestrator's side: the buckets the profile names, the
Secret-typed fields of its blocks, the graph phase 1 writes, and the [sources] and [corpus]
folders (phase 1 and the scorecard run on the orchestrator)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as gexc
from pydantic import SecretStr

from tasks.extraction import streams
from tasks.gcp.grants import NODE_CONDITION, NODE_WRITES
from tasks.graph import queries as q
from tasks.graph.open import graph_server
from tasks.graph.store import GraphStore
from tasks.shared.checks import Check, failure, passed, skipped
from tasks.shared.errors import GraphError
from tasks.shared.gcs_sync import gcs_bucket_from_env_or_block

if TYPE_CHECKING:
    from tasks.profile import Profile

BUCKET_PERMISSIONS = ("storage.objects.create", "storage.objects.get",
                      "storage.objects.list", "storage.objects.delete")


# --- the bucket ---------------------------------------------------------------------------------
def bucket_checks(cfg: Profile, training: bool, orchestrator: str | None = None
                   ) -> Iterator[Check]:
    refs = sorted({r for r in (cfg.gcs_block, cfg.training.gcs_block, cfg.corpus.gcs_block) if r})
    if not refs:
        if training:
            yield failure("bucket", "no GCS bucket: the node cannot fetch its datasets or keep "
                        "adapters and checkpoints", "set gcs_block at the top of the profile "
                        "(a saved GcsBucket block) or SLM_YOYO_WEIGHTS_GCS_BUCKET")
        else:
            yield skipped("bucket", "none configured, and the night does not train")
        return
    for ref in refs:
        name = f"bucket {ref}"
        try:
            gcs = gcs_bucket_from_env_or_block(ref)
        except Exception as e:  # noqa: BLE001 - a block that does not load, no credentials
            yield failure(name, f"{type(e).__name__}: {str(e)[:300]}",
                        "save the GcsBucket block (docs/operator-gcp.md, section 4) or fix "
                        "gcs_block")
            continue
        yield _key_check(name, gcs, orchestrator)
        if training and ref == cfg.training.gcs_block:
            yield _node_writes_check(name, gcs)
        yield from _one_bucket(name, gcs)


def _node_writes_check(name: str, gcs: Any) -> Check:
    """The node writes its results through this block, and `gcp setup` lets it write only
    NODE_WRITES at the bucket's root (the IAM Condition slm-node-results): under a folder,
    every upload of a trained adapter would be refused."""
    folder = (gcs.bucket_folder or "").strip("/")
    where = ", ".join(NODE_WRITES)
    if folder:
        return failure(f"{name}: node writes", f"the block writes under gs://{gcs.bucket}/"
                       f"{folder}/, but the node may write only {where} at the bucket's root "
                       f"(gcp setup's condition {NODE_CONDITION}): its adapters and checkpoints "
                       "would be refused (403, storage.objects.create)",
                       "save the GcsBucket block without bucket_folder (docs/operator-gcp.md, "
                       "section 4)")
    return passed(f"{name}: node writes", f"at the bucket's root, where the node may write "
                  f"({where})")


def _key_check(name: str, gcs: Any, orchestrator: str | None) -> Check:
    """The node loads the same saved block: a key in it is the identity the node acts as."""
    creds = getattr(gcs, "gcp_credentials", None)
    info = getattr(creds, "service_account_info", None)
    path = getattr(creds, "service_account_file", None)
    if info is None and path is None:
        return passed(f"{name}: credentials", "none in the block: each machine uses its own "
                   "service account (Application Default Credentials)")
    if info is not None:
        value = info.get_secret_value() if hasattr(info, "get_secret_value") else info
        email = dict(value).get("client_email")  # a SecretDict
    else:
        try:
            email = json.loads(Path(str(path)).read_text()).get("client_email")
        except (OSError, ValueError):
            email = None
    if orchestrator and email == orchestrator:
        return failure(f"{name}: credentials", f"the block holds a key of {email}, the "
                     "orchestrator's own account: the node loads this block, so it would act "
                     "as the orchestrator (instance admin) instead of its own account",
                     "save the GcsBucket block without gcp_credentials (docs/operator-gcp.md, "
                     "section 4): each machine then uses its own service account")
    return passed(f"{name}: credentials", f"a key of {email or 'an unnamed account'} in the block "
               "(both machines act as it; without a key each uses its own account)")


def _one_bucket(name: str, gcs: Any) -> Iterator[Check]:
    try:
        bucket = gcs.get_bucket()
    except gexc.NotFound:
        yield failure(name, f"gs://{gcs.bucket} does not exist",
                    f"`gcloud storage buckets create gs://{gcs.bucket}`, or fix the block")
        return
    except Exception as e:  # noqa: BLE001 - Forbidden, no credentials
        yield failure(name, f"cannot read gs://{gcs.bucket}: {type(e).__name__}: {str(e)[:200]}",
                    "grant the orchestrator roles/storage.objectAdmin on the bucket")
        return
    try:
        granted = set(bucket.test_iam_permissions(list(BUCKET_PERMISSIONS)))
    except Exception as e:  # noqa: BLE001
        yield failure(f"{name}: IAM", f"testIamPermissions failed: {type(e).__name__}: {e}",
                    "grant the orchestrator roles/storage.objectAdmin on the bucket")
    else:
        missing = [p for p in BUCKET_PERMISSIONS if p not in granted]
        yield (failure(f"{name}: IAM", f"the orchestrator lacks {', '.join(missing)}",
                     "grant the orchestrator roles/storage.objectAdmin on the bucket")
               if missing else passed(f"{name}: IAM", f"{len(BUCKET_PERMISSIONS)} object "
                                   "permissions held"))
    folder = (gcs.bucket_folder or "").strip("/")
    key = f"{folder + '/' if folder else ''}preflight/probe-{uuid.uuid4().hex[:12]}"
    try:
        blob = bucket.blob(key)
        blob.upload_from_string(b"slm-nightly preflight\n")
        blob.delete()
    except Exception as e:  # noqa: BLE001
        yield failure(f"{name}: write", f"writing gs://{gcs.bucket}/{key} failed: "
                    f"{type(e).__name__}: {str(e)[:200]}",
                    "grant the orchestrator roles/storage.objectAdmin on the bucket")
        return
    yield passed(f"{name}: write", f"wrote and deleted gs://{gcs.bucket}/{key}")



# --- blocks and secrets -------------------------------------------------------------------------
def secret_checks(cfg: Profile) -> Iterator[Check]:
    """A Secret-typed field that is set but empty (a Neo4j block saved without its password)."""
    blocks = {"compute": cfg.compute, "inference": cfg.inference, "graph": cfg.graph,
              "serving": cfg.serving}
    empty = [f"[{section}] {name}" for section, b in blocks.items() if b is not None
             for name in type(b).model_fields
             if isinstance(v := getattr(b, name), SecretStr) and not v.get_secret_value()]
    yield (failure("secrets", f"empty: {', '.join(empty)}", "set them in the saved blocks "
                 "(docs/operator-gcp.md, section 4)") if empty else
           passed("secrets", "no Secret-typed field of the profile's blocks is empty"))


# --- the graph, the sources and the corpus (phase 1 and the scorecard run here) -----------------
def graph_checks(cfg: Profile) -> Iterator[Check]:
    """Open the profile's graph as phase 1 does (tasks/graph/open.py) and read from it; the
    detail names the URI, never the password. An embedded FalkorDB is phase 1's to start."""
    server = graph_server(cfg.graph)
    if server.connect is None:
        yield skipped("graph", f"{server.where}: phase 1 starts it on this machine")
        return
    schema: Check | None = None
    try:
        with server.connect() as store:
            store._read("RETURN 1 AS one")
            schema = schema_check(store, server.where)
    except Exception as e:  # noqa: BLE001 - GraphError, the drivers' own
        cause = e.__cause__ or e
        text = f"{type(cause).__name__}: {str(cause)[:200]}"
        if server.secret:
            text = text.replace(server.secret, "***")
        if "loading" in text.lower() and server.loads_data:
            yield passed("graph", f"{server.where} answers, and is still loading its data")
            return
        yield failure("graph", f"cannot open {server.where}: {text}", server.fix)
        return
    yield passed("graph", f"{server.where} answers a read")
    if schema is not None:
        yield schema


def schema_check(store: GraphStore, where: str) -> Check | None:
    """Neo4j: the unique constraints phase 1 merges by. Missing ones are created now, as
    phase 1's first step would (IF NOT EXISTS: nothing else changes), so that a refusal — no
    CREATE CONSTRAINT privilege, an index in the way, duplicate keys — is said tonight, with
    its fix, and not at 2 a.m. None for FalkorDB, whose indexes phase 1 makes as it opens."""
    missing = store.missing_keys()
    if missing is None:
        return None
    if not missing:
        keys = [f"{label}.{prop}" for _, label, prop in q.UNIQUE_KEYS]
        return passed("graph schema", f"{where}: unique constraints on "
                      f"{', '.join(keys[:-1])} and {keys[-1]}")
    try:
        store.ensure_schema()
    except GraphError as e:
        return failure("graph schema", f"{where}: no unique constraint on "
                       f"{', '.join(missing)}, and creating it failed: {e}",
                       "see the message; docs/operations.md (Neo4j: constraints and privileges)")
    return passed("graph schema", f"{where}: created the unique constraints on "
                  f"{', '.join(missing)}")


def folder_checks(cfg: Profile) -> Iterator[Check]:
    """The [sources] folders (phase 1) and the [corpus] root (the scorecard): readable
    directories on this machine, the orchestrator."""
    # (check name, folder, where the profile sets it, what it holds)
    folders = [(f"sources {s.name}", value, s.profile_key, s.description)
               for s, value in streams.configured(cfg.sources)]
    unknown = streams.unknown_others(cfg.sources)
    if unknown:
        yield failure("sources", f"[sources.other] names {', '.join(unknown)}: no stream is "
                      "read from there by that name, so phase 1 fails",
                      "fix or remove the name (the streams: tasks/extraction/streams.py)")
    if not folders:
        yield failure("sources", "no [sources] stream is configured: phase 1 fails",
                    f"set {streams.settings_text()} in [sources]")
    if cfg.corpus.root:
        folders.append(("corpus", cfg.corpus.root, "[corpus] root", ""))
    for name, value, key, holds in folders:
        path = Path(value).expanduser()
        if not path.is_dir():
            yield failure(name, f"{path} is not a directory on the orchestrator",
                        f"create it (`mkdir -p {path}`), or fix {key} in the profile")
        elif not os.access(path, os.R_OK | os.X_OK):
            yield failure(name, f"{path} is not readable by this user",
                        f"`chmod u+rx {path}`, or run the orchestrator as its owner")
        else:
            yield passed(name, f"{path} ({holds})" if holds else str(path))


