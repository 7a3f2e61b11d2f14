"""Who may do what: the roles `gcp setup` grants, each with the calls that need it.

Derived from the calls the code makes (the table CALLS: a call, the permission Google checks
for it, the role that holds it). Two accounts: the orchestrator starts, stops and configures
the node; the node runs whatever code the bucket holds, so it gets the bucket, its secrets and
its logs, and cannot touch any instance.

The orchestrator's compute role is granted on each node instance (`gcp nodes` writes the
instance's own policy), not on the project: the node holds the Prefect API's auth string, so
whatever it can have the orchestrator's worker run stays within the nodes; on the project the
orchestrator only reads (roles/compute.viewer: operations and quotas).

The node reads the whole bucket and writes only its own results: roles/storage.objectAdmin
on the bucket under an IAM Condition naming the objects a node run writes (NODE_WRITES: its
adapters, checkpoints, promotions and environment record), so it cannot rewrite the code, the
datasets, the graph snapshots or the run records that the orchestrator acts on
(cloud.google.com/storage/docs/access-control/using-iam-conditions; the bucket has uniform
access, which conditions need).

The image builder runs as the node's account and publishes the weights it converted under
weights/ (tasks/gcp/image.py): roles/storage.objectCreator under a second condition
(NODE_PUBLISHES), which creates objects and cannot overwrite or delete one (an overwrite needs
storage.objects.delete: cloud.google.com/storage/docs/access-control/iam-roles), so no node can
change weights a later build takes.

Storage: roles/storage.objectAdmin has no storage.buckets.get, and prefect-gcp's GcsBucket calls
client.get_bucket() before each read and write (googleapis/google-cloud-python#9065); the
bucket-level roles/storage.legacyBucketReader adds buckets.get (and objects.list), nothing more.
"""

from __future__ import annotations

from typing import Literal

Who = Literal["orchestrator", "node"]
Where = Literal["project", "instance", "bucket", "node-results", "node-weights", "node-account",
                "secrets", "auth-secret"]

# the objects a node run writes, relative to the bucket (the slm-gcs block has no folder:
# docs/operator-gcp.md, section 4): the artifact store's adapters, checkpoints and promotion
# pointers (tasks/training/registry.py; not its graph snapshots, which the orchestrator writes)
# and the environment record (tasks/shared/environment.py RECORD_KEY); a name ending in / is a
# prefix
NODE_WRITES = ("artifacts/adapters/", "artifacts/checkpoints/", "artifacts/promoted/",
               "records/node-environment.json")
NODE_CONDITION = "slm-node-results"  # the title of the condition on NODE_WRITES
NODE_PUBLISHES = ("weights/",)  # what the image builder creates (tasks/gcp/image.py)
# where → the IAM Condition's title, description and objects (a name ending in / is a prefix)
CONDITIONS: dict[Where, tuple[str, str, tuple[str, ...]]] = {
    "node-results": (NODE_CONDITION, "the objects a node run writes", NODE_WRITES),
    "node-weights": ("slm-node-weights", "the weights an image build converted, created once",
                     NODE_PUBLISHES)}

# (who, call, permission, role, where the role is granted)
CALLS: list[tuple[Who, str, str, str, Where]] = [
    ("orchestrator", "instances.start/stop/get", "compute.instances.start",
     "roles/compute.instanceAdmin.v1", "instance"),
    ("orchestrator", "instances.setScheduling", "compute.instances.setScheduling",
     "roles/compute.instanceAdmin.v1", "instance"),
    ("orchestrator", "instances.setMetadata", "compute.instances.setMetadata",
     "roles/compute.instanceAdmin.v1", "instance"),
    ("orchestrator", "instances.getGuestAttributes", "compute.instances.getGuestAttributes",
     "roles/compute.instanceAdmin.v1", "instance"),
    ("orchestrator", "zoneOperations.wait/list", "compute.zoneOperations.get",
     "roles/compute.viewer", "project"),
    ("orchestrator", "regions.get (quotas)", "compute.regions.get",
     "roles/compute.viewer", "project"),
    ("orchestrator", "setMetadata on an instance that runs as the node",
     "iam.serviceAccounts.actAs", "roles/iam.serviceAccountUser", "node-account"),
    ("orchestrator", "GcsBucket.get_bucket (every read and write)", "storage.buckets.get",
     "roles/storage.legacyBucketReader", "bucket"),
    ("orchestrator", "deploy, datasets, run records up", "storage.objects.create",
     "roles/storage.objectAdmin", "bucket"),
    ("orchestrator", "adapters listed and fetched", "storage.objects.get",
     "roles/storage.objectAdmin", "bucket"),
    ("orchestrator", "preflight: each secret's latest version (never its value)",
     "secretmanager.versions.get", "roles/secretmanager.viewer", "secrets"),
    ("orchestrator", "logs of the Prefect units", "logging.logEntries.create",
     "roles/logging.logWriter", "project"),
    ("node", "GcsBucket.get_bucket (every read and write)", "storage.buckets.get",
     "roles/storage.legacyBucketReader", "bucket"),
    ("node", "code and datasets down", "storage.objects.get", "roles/storage.objectViewer",
     "bucket"),
    ("node", "adapters, checkpoints, its environment record up", "storage.objects.create",
     "roles/storage.objectAdmin", "node-results"),
    ("node", "the image builder publishes the weights it converted", "storage.objects.create",
     "roles/storage.objectCreator", "node-weights"),
    ("node", "the startup script reads its keys", "secretmanager.versions.access",
     "roles/secretmanager.secretAccessor", "secrets"),
    ("node", "its logs", "logging.logEntries.create", "roles/logging.logWriter", "project"),
    ("orchestrator", "its install writes the Prefect server's auth string",
     "secretmanager.versions.access", "roles/secretmanager.secretAccessor", "auth-secret"),
    ("orchestrator", "preflight: the auth string's latest version (never its value)",
     "secretmanager.versions.get", "roles/secretmanager.viewer", "auth-secret"),
    ("node", "its worker authenticates to the Prefect server", "secretmanager.versions.access",
     "roles/secretmanager.secretAccessor", "auth-secret"),
]


def roles(who: Who, where: Where) -> list[str]:
    """The roles `who` is granted on `where`, in a stable order."""
    return sorted({role for w, _, _, role, at in CALLS if w == who and at == where})


def condition(bucket: str, where: Where) -> dict[str, str]:
    """The IAM Condition of the node's role granted on `where` (CONDITIONS) in `bucket`: those
    objects only (CEL on resource.name, "projects/_/buckets/B/objects/O")."""
    title, description, objects = CONDITIONS[where]
    at = f"projects/_/buckets/{bucket}/objects/"
    terms = [f'resource.name.startsWith("{at}{w}")' if w.endswith("/") else
             f'resource.name == "{at}{w}"' for w in objects]
    return {"title": title, "description": description, "expression": " || ".join(terms)}
