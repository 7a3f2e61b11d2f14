"""The GPU quota a night needs, read from Cloud Quotas; when one is short, the exact request
to file, written to a file (a person files it: Google reviews GPU quota by hand, often for
days, and a new project's GPUS-ALL-REGIONS is 0).

Quota ids: the `quotaId` of Compute's QuotaInfo resources (cloud.google.com/docs/quotas/
reference/rest/v1/projects.locations.services.quotaInfos; the ids are listed by `gcloud beta
quotas info list --service=compute.googleapis.com`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tasks.gcp.clients import Clients
from tasks.gcp.reconcile import api_call

SERVICE = "compute.googleapis.com"
ALL_REGIONS = "GPUS-ALL-REGIONS-per-project"
L4 = "NVIDIA-L4-GPUS-per-project-region"
L4_SPOT = "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region"


@dataclass
class QuotaNeed:
    quota_id: str
    region: str | None  # None: project-wide
    need: int
    have: float | None = None  # None: not read yet

    @property
    def short(self) -> bool:
        return self.have is not None and self.have < self.need

    def line(self) -> str:
        where = f" in {self.region}" if self.region else ""
        state = "short" if self.short else "ok"
        return f"  {state:13} quota {self.quota_id}{where} — limit {self.have:g}, need {self.need}"


def needs(region: str, nodes: int, provisioning: str, on_demand_fallback: bool
          ) -> list[QuotaNeed]:
    """Each node holds one L4 while it runs; spot nodes count against the preemptible quota
    (a Spot VM falls back to the ordinary one only where the preemptible quota is absent)."""
    out = [QuotaNeed(ALL_REGIONS, None, nodes)]
    if provisioning == "spot":
        out.append(QuotaNeed(L4_SPOT, region, nodes))
    if provisioning == "on-demand" or on_demand_fallback:
        out.append(QuotaNeed(L4, region, nodes))
    return out


def _limit(info: Any, region: str | None) -> float:
    """The limit of the dimension for `region` (or the project-wide one); the entry with no
    dimensions is the default for every region not listed."""
    default = 0.0
    for d in info.dimensions_infos:
        dims = dict(d.dimensions)
        if region is not None and dims.get("region") == region:
            return float(d.details.value)
        if not dims:
            default = float(d.details.value)
    return default


def read(clients: Clients, project: str, wanted: list[QuotaNeed]) -> list[QuotaNeed]:
    for q in wanted:
        name = (f"projects/{project}/locations/global/services/{SERVICE}/quotaInfos/"
                f"{q.quota_id}")
        info: Any = api_call(f"quota {q.quota_id}", partial(
            clients.quotas.get_quota_info, request={"name": name}))
        q.have = _limit(info, q.region)
    return wanted


CONTACT = "REPLACE-WITH-YOUR-EMAIL"


def request(project: str, short: list[QuotaNeed], contact: str = CONTACT) -> dict[str, Any]:
    """The QuotaPreference bodies to create (cloudquotas v1 projects.locations.quotaPreferences
    .create), and the same as gcloud commands. An increase needs a contact email (Google asks
    it questions there); the file carries a placeholder to replace."""
    prefs, commands = [], []
    for q in short:
        body: dict[str, Any] = {
            "service": SERVICE, "quotaId": q.quota_id,
            "quotaConfig": {"preferredValue": str(q.need)},
            "justification": "slm-nightly: one NVIDIA L4 per node for a nightly batch job"}
        if q.region:
            body["dimensions"] = {"region": q.region}
        body["contactEmail"] = contact
        prefs.append(body)
        dims = f" --dimensions=region={q.region}" if q.region else ""
        commands.append(f"gcloud quotas preferences create --service={SERVICE} "
                        f"--project={project} --quota-id={q.quota_id} "
                        f"--preferred-value={q.need}{dims} "
                        f"--justification='{body['justification']}' --email={contact}")
    return {"parent": f"projects/{project}/locations/global", "quotaPreferences": prefs,
            "gcloud": commands}


def write_request(path: Path, project: str, short: list[QuotaNeed]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(request(project, short), indent=2) + "\n", encoding="utf-8")
    return path
