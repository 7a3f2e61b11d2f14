"""The nightly's alerts: Prefect automations from automations/nightly-alerts.yaml.

The file is in the format `prefect automation create --from-file` reads, but a
send-notification action names its block only by `block_document_id`, an id the file cannot
know, and `automation create` makes a second copy each time it runs. `install` resolves the
block's id, checks the deployment the triggers match (by its flow's and its own name), and
replaces automations of the same name: running it twice leaves the same two automations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import yaml
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore
from prefect.exceptions import ObjectNotFound

from tasks.shared.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ALERTS_FILE = ROOT / "automations" / "nightly-alerts.yaml"
PLACEHOLDER = UUID(int=0)  # the file's block_document_id, replaced at install


def load_file(path: Path = ALERTS_FILE) -> list[dict[str, Any]]:
    """The automations in the file, as dicts (validated once the ids are filled in)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"alerts: cannot read {path}: {e}") from None
    items = data.get("automations") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(a, dict) and a.get("name")
                                               for a in items):
        raise ConfigError(f"alerts: {path} holds no `automations:` list of named automations")
    return items


def _retarget(spec: Any, flow: str, deployment: str) -> Any:
    """match_related entries naming the flow or the deployment, renamed to `flow`/`deployment`."""
    specs = spec if isinstance(spec, list) else [spec]
    for s in specs:
        if isinstance(s, dict):
            role = s.get("prefect.resource.role")
            if role == "flow":
                s["prefect.resource.name"] = flow
            elif role == "deployment":
                s["prefect.resource.name"] = deployment
    return spec


def prepare(items: list[dict[str, Any]], block_id: UUID, deployment: str) -> list[Any]:
    """AutomationCore models: the notification block's id in every send-notification action,
    the triggers matching `deployment` ("flow/name")."""
    flow, _, name = deployment.partition("/")
    out = []
    for item in items:
        item = yaml.safe_load(yaml.safe_dump(item))  # a copy
        trigger = item.get("trigger") or {}
        if "match_related" in trigger:
            trigger["match_related"] = _retarget(trigger["match_related"], flow, name)
        for action in item.get("actions") or []:
            if action.get("type") == "send-notification":
                action["block_document_id"] = str(block_id)
        try:
            out.append(AutomationCore.model_validate(item))
        except ValueError as e:
            raise ConfigError(f"alerts: automation {item['name']!r} is not valid: {e}") from None
    return out


def resolve_block(client: Any, ref: str) -> tuple[UUID, str]:
    """A notification block by `type-slug/name` (as `prefect block ls` shows it) or by its
    name alone when only one block has it → (id, "type-slug/name")."""
    slug, _, name = ref.rpartition("/")
    if slug:
        try:
            doc = client.read_block_document_by_name(name, slug)
        except ObjectNotFound:
            raise ConfigError(f"alerts: no block {ref!r} on the Prefect server "
                              "(prefect block ls)") from None
        docs = [doc]
    else:
        docs = [d for d in client.read_block_documents() if d.name == name]
        if not docs:
            raise ConfigError(f"alerts: no block named {name!r} on the Prefect server "
                              "(prefect block ls)")
        if len(docs) > 1:
            kinds = ", ".join(f"{d.block_type.slug}/{d.name}" for d in docs if d.block_type)
            raise ConfigError(f"alerts: several blocks are named {name!r} ({kinds}): pass "
                              "--notify-block TYPE/NAME")
    doc = docs[0]
    full = f"{doc.block_type.slug if doc.block_type else slug}/{doc.name}"
    if "notify" not in (doc.block_schema.capabilities if doc.block_schema else []):
        raise ConfigError(f"alerts: block {full} cannot send notifications (its type has no "
                          "`notify` capability): use a Slack, email, webhook… block")
    return doc.id, full


def install(notify_block: str, deployment: str = "nightly/production",
            path: Path = ALERTS_FILE) -> list[dict[str, str]]:
    """Create or update the file's automations on the Prefect server PREFECT_API_URL names;
    one row per automation: {name, id, action: created|updated}."""
    if deployment.count("/") != 1 or not all(deployment.split("/")):
        raise ConfigError(f"alerts: --deployment {deployment!r}: FLOW/NAME, e.g. "
                          "nightly/production")
    items = load_file(path)
    rows = []
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise ConfigError(f"alerts: no deployment {deployment!r} on the Prefect server — "
                              "deploy it first (prefect deploy), then install the alerts") from None
        block_id, _ = resolve_block(client, notify_block)
        for automation in prepare(items, block_id, deployment):
            existing = client.read_automations_by_name(automation.name)
            if existing:
                keep, *extra = existing
                client.update_automation(keep.id, automation)
                for old in extra:  # copies left by `prefect automation create`
                    client.delete_automation(old.id)
                rows.append({"name": automation.name, "id": str(keep.id), "action": "updated"})
            else:
                new_id = client.create_automation(automation)
                rows.append({"name": automation.name, "id": str(new_id), "action": "created"})
    return rows
