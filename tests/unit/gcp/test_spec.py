"""The [gcp] table: names derived from [compute], and the bad inputs refused with the key and
the fix; the quota a profile needs and the request written when it is short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.gcp import quota
from tasks.gcp.spec import spec_from_profile
from tasks.shared.errors import ConfigError

P = Path("profiles/x.toml")


def profile(**gcp: object) -> dict:
    return {"compute": {"project": "acme-ml", "zone": "europe-west4-a",
                        "fallback_zones": ["europe-west4-b"], "instance": "gpu",
                        "provisioning": "spot", "on_demand_fallback": True,
                        "node": {"prefect_api_key_secret": "prefect-key"}},
            "gcp": {"bucket": "acme-ml-slm", **gcp}}


def test_names_come_from_compute_and_the_defaults() -> None:
    s = spec_from_profile(P, profile(secrets=["extra", "prefect-key"]))
    assert (s.project, s.zones, s.home_region, s.home_zone) == (
        "acme-ml", ["europe-west4-a", "europe-west4-b"], "europe-west4", "europe-west4-a")
    assert s.node_instance == "gpu" and s.on_demand_fallback is True
    assert s.secrets == ["prefect-key", "extra"]  # the profile's first, no duplicates
    assert s.prefect_key_secret == "prefect-key"
    assert s.orchestrator_email == "slm-orchestrator@acme-ml.iam.gserviceaccount.com"
    assert s.node_email == "slm-node@acme-ml.iam.gserviceaccount.com"
    assert s.subnet_url == "projects/acme-ml/regions/europe-west4/subnetworks/slm-subnet"
    assert s.network_url == "projects/acme-ml/global/networks/slm-net"
    assert s.data_dirs == []  # this profile names no folder


def test_the_folders_the_night_reads_are_the_absolute_ones_of_the_profile() -> None:
    data = {**profile(), "sources": {"transcripts": "/srv/slm/t", "research": "rel/r",
                                     "other": {"notes": "/srv/slm/n", "memos": "rel/m"}},
            "corpus": {"root": "/srv/slm/corpus"}}
    assert spec_from_profile(P, data).data_dirs == ["/srv/slm/t", "/srv/slm/n",
                                                    "/srv/slm/corpus"]


@pytest.mark.parametrize("gcp, says", [
    ({"bucket": "my-bucket"}, "shipped placeholders"),
    ({"bucket": "Bad_Bucket!"}, "bucket: Value error, 'Bad_Bucket!' is not a bucket name"),
    ({"orchestrator_zone": "us-east1-b"}, "zones ['us-east1-b'] are not in region "
     "'europe-west4'"),
    ({"subnet_range": "8.8.8.0/24"}, "a private IPv4 range from /8 to /29"),
    ({"node_account": "n"}, "'n' is not a service account id"),
    ({"network": "Net_1"}, "'Net_1' is not a Compute resource name"),
    ({"prefect": "cloud", "secrets": []}, None),
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
])
def test_bad_tables_are_refused_naming_the_key(gcp: dict, says: str | None) -> None:
    data = profile(**gcp)
    if says is None:  # prefect = cloud without the key's secret
        del data["compute"]["node"]["prefect_api_key_secret"]
        says = "prefect = \"cloud\" needs [compute.node] prefect_api_key_secret"
    with pytest.raises(ConfigError) as e:
        spec_from_profile(P, data)
    assert says in str(e.value)
    assert str(P) in str(e.value)


def test_a_saved_compute_block_needs_the_names_in_gcp() -> None:
    with pytest.raises(ConfigError, match=r"put project, zone and fallback_zones in \[gcp\]"):
        spec_from_profile(P, {"compute": {"type": "gce", "block": "prod"},
                              "gcp": {"bucket": "acme-slm"}})
    s = spec_from_profile(P, {"compute": {"type": "gce", "block": "prod"}, "gcp": {
        "bucket": "acme-slm", "project": "acme", "zones": ["us-east1-c"]}})
    assert (s.project, s.home_region, s.secrets) == ("acme", "us-east1", [])


def test_the_quota_a_profile_needs() -> None:
    spot = quota.needs("us-central1", 2, "spot", on_demand_fallback=True)
    assert [(q.quota_id, q.region, q.need) for q in spot] == [
        ("GPUS-ALL-REGIONS-per-project", None, 2),
        ("PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", "us-central1", 2),
        ("NVIDIA-L4-GPUS-per-project-region", "us-central1", 2)]
    assert [q.quota_id for q in quota.needs("us-central1", 1, "on-demand", False)] == [
        "GPUS-ALL-REGIONS-per-project", "NVIDIA-L4-GPUS-per-project-region"]
    assert [q.quota_id for q in quota.needs("us-central1", 1, "spot", False)] == [
        "GPUS-ALL-REGIONS-per-project", "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region"]


def test_the_request_written_for_short_quota(tmp_path: Path) -> None:
    short = [quota.QuotaNeed("GPUS-ALL-REGIONS-per-project", None, 1, 0.0),
             quota.QuotaNeed("PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", "us-central1", 1,
                             0.0)]
    assert [q.short for q in short] == [True, True]
    assert not quota.QuotaNeed("x", None, 1, 1.0).short
    written = json.loads(quota.write_request(tmp_path / "q.json", "acme", short).read_text())
    assert written["parent"] == "projects/acme/locations/global"
    assert written["quotaPreferences"][1] == {
        "service": "compute.googleapis.com",
        "quotaId": "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region",
        "quotaConfig": {"preferredValue": "1"},
        "justification": "slm-nightly: one NVIDIA L4 per node for a nightly batch job",
        "contactEmail": "REPLACE-WITH-YOUR-EMAIL", "dimensions": {"region": "us-central1"}}
    assert "dimensions" not in written["quotaPreferences"][0]
    assert written["gcloud"][0] == (
        "gcloud quotas preferences create --service=compute.googleapis.com --project=acme "
        "--quota-id=GPUS-ALL-REGIONS-per-project --preferred-value=1 --justification='slm-nightly:"
        " one NVIDIA L4 per node for a nightly batch job' --email=REPLACE-WITH-YOUR-EMAIL")
