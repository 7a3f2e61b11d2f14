"""`gcp nodes`: the GPU node instances, one per zone (and per `[compute] nodes`), from the
newest image of the family, each created and then stopped.

The boot disk is the image's own size (images.getFromFamily diskSizeGb): a disk larger than the
image is billed around the clock in every zone for space nothing uses, a smaller one is refused.
No startup script is written here: before every start the nightly (and `node smoke`) renders it
from the profile and writes it (tasks/compute/gce/lifecycle.py GceNode.prepare), so the node
boots what the profile says; the instance is created with guest attributes on, where the script
reports its errors. A G2 machine type carries its L4 (no guestAccelerators: cloud.google.com/
compute/docs/gpus#l4-gpus), which cannot live-migrate: onHostMaintenance TERMINATE.

Instances insert RUNNING (Compute has no "create stopped"): each is stopped as soon as its
insert is done, so it costs the minutes of its first boot.

The orchestrator's compute role is granted here, on each instance's own IAM policy
(instances.setIamPolicy), not on the project: it can start, stop and configure the nodes and
no other instance (tasks/gcp/grants.py says why).
"""

from __future__ import annotations

from typing import Any

from tasks.gcp import grants
from tasks.gcp.clients import Clients
from tasks.gcp.identity import bind
from tasks.gcp.network import ComputeResource, get_or_none
from tasks.gcp.reconcile import Found, GcpError, Skipped, api_call
from tasks.gcp.spec import GcpSpec

MACHINE_TYPE = "g2-standard-4"
FAMILY = "slm-node"
# A disk inserted without diskType is pd-standard (cloud.google.com/compute/docs/disks/performance:
# 0.12 MiB/s a GiB, ~12 MiB/s on 100 GB, some 20 min to read the 15.6 GB GGUF at every boot);
# pd-balanced reads 0.28 MiB/s a GiB, at least 140 MiB/s. The orchestrator's and the image
# builder's disks too (a first install of ~10 GB, the Prefect server's database, the conversion)
DISK_TYPE = "pd-balanced"
# the error code of an insert the zone has no capacity for (cloud.google.com/compute/docs/
# troubleshooting/troubleshooting-resource-availability)
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
ORCHESTRATOR_ROLES = grants.roles("orchestrator", "instance")


def instance_names(spec: GcpSpec) -> list[tuple[str, str]]:
    """(zone, name) of every node instance: `[compute] instance` (or `zone_instances`) in each
    zone, then `-2` … `-N` for `[compute] nodes = N` (tasks/compute/protocol.py nodes_for)."""
    out = []
    for zone in spec.zones:
        base = spec.zone_instances.get(zone, spec.node_instance)
        out += [(zone, base if i == 1 else f"{base}-{i}") for i in range(1, spec.nodes + 1)]
    return out


def newest_image(spec: GcpSpec, clients: Clients, family: str = FAMILY) -> Any:
    img = get_or_none(f"image family {family}", lambda: clients.compute(
        "ImagesClient").get_from_family(project=spec.project, family=family))
    if img is None:
        raise GcpError(f"image family {family}: no image in project {spec.project} — build "
                       "the node image first (docs/operator-gcp.md §3)")
    return img


class NodeVm(ComputeResource):
    kind = "node"

    def __init__(self, zone: str, name: str, spec: GcpSpec, clients: Clients,
                 image: Any) -> None:
        super().__init__(name, spec, clients)
        self.zone, self.image = zone, image

    def __str__(self) -> str:
        return f"node {self.zone}/{self.name}"

    def _client(self) -> Any:
        return self.clients.compute("InstancesClient")

    def read(self) -> Found:
        s = self.spec
        vm = get_or_none(str(self), lambda: self._client().get(
            project=s.project, zone=self.zone, instance=self.name))
        if vm is None:
            return Found(False)
        accounts = [a.email for a in vm.service_accounts]
        # how it was built (the operator's to settle), apart from the grants (repair adds them)
        self.misbuilt = [] if accounts == [s.node_email] else [
            f"runs as {accounts}, not {s.node_email}"]
        if vm.network_interfaces and vm.network_interfaces[0].access_configs:
            self.misbuilt.append("has an external address")
        ungranted = self._ungranted(api_call(f"{self}: getIamPolicy", self._policy))
        return Found(True, self.misbuilt + [f"the orchestrator lacks {r} on it"
                                            for r in ungranted], str(vm.status))

    def plan(self) -> str:
        return (f"instances.insert {MACHINE_TYPE} from {self.image.name} "
                f"({self.image.disk_size_gb} GB {DISK_TYPE} disk), {self.spec.provisioning}, "
                f"setIamPolicy (the orchestrator's {', '.join(ORCHESTRATOR_ROLES)} on it), "
                "then stop")

    def _policy(self) -> Any:
        s = self.spec
        return self._client().get_iam_policy(request={
            "project": s.project, "zone": self.zone, "resource": self.name,
            "options_requested_policy_version": 3})

    def _ungranted(self, policy: Any) -> list[str]:
        member = f"serviceAccount:{self.spec.orchestrator_email}"
        have = {b.role for b in policy.bindings if member in b.members
                and not b.condition.expression}
        return [r for r in ORCHESTRATOR_ROLES if r not in have]

    def _grant(self) -> None:
        """The orchestrator's roles added to this instance's policy, written back with the etag
        it was read with (a concurrent change fails the write rather than being lost)."""
        from google.cloud import compute_v1

        s, member = self.spec, f"serviceAccount:{self.spec.orchestrator_email}"
        policy = api_call(f"{self}: getIamPolicy", self._policy)
        for role in self._ungranted(policy):
            bind(policy.bindings, role, [member], compute_v1.Binding)
        request = compute_v1.ZoneSetPolicyRequest(policy=policy)
        api_call(f"{self}: setIamPolicy", lambda: self._client().set_iam_policy(
            project=s.project, zone=self.zone, resource=self.name,
            zone_set_policy_request_resource=request))

    def create(self) -> None:
        """Insert with the profile's provisioning model; a spot insert the zone has no L4 for is
        tried on-demand where `[compute] on_demand_fallback` says so; a zone out of L4s either
        way is skipped (`gcp nodes` again later makes it), and its neighbours are made."""
        s = self.spec
        models = [s.provisioning] + (["on-demand"] if s.provisioning == "spot"
                                     and s.on_demand_fallback else [])
        for model in models:
            try:
                self._insert(model)
            except GcpError as e:
                if STOCKOUT not in str(e):
                    raise
                continue
            self._grant()
            self._stop()
            return
        raise Skipped(f"no L4 in {self.zone} for {' or '.join(models)} ({STOCKOUT}): run `gcp "
                      "nodes` again later, or leave the zone out of [compute] fallback_zones")

    def _stop(self) -> None:
        s, vms = self.spec, self._client()
        self.call("stop", lambda: vms.stop_unary(project=s.project, zone=self.zone,
                                                 instance=self.name), zone=self.zone)

    def _insert(self, provisioning: str) -> None:
        from google.cloud import compute_v1

        s = self.spec
        spot = provisioning == "spot"
        scheduling = compute_v1.Scheduling(
            on_host_maintenance="TERMINATE", automatic_restart=False,
            provisioning_model="SPOT" if spot else "STANDARD",
            **({"instance_termination_action": "STOP"} if spot else {}))
        body = compute_v1.Instance(
            name=self.name, machine_type=f"zones/{self.zone}/machineTypes/{MACHINE_TYPE}",
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=self.image.self_link,
                    disk_size_gb=self.image.disk_size_gb,
                    disk_type=f"zones/{self.zone}/diskTypes/{DISK_TYPE}"))],
            network_interfaces=[compute_v1.NetworkInterface(subnetwork=s.subnet_url)],
            service_accounts=[compute_v1.ServiceAccount(
                email=s.node_email, scopes=["https://www.googleapis.com/auth/cloud-platform"])],
            scheduling=scheduling,
            metadata=compute_v1.Metadata(items=[compute_v1.Items(
                key="enable-guest-attributes", value="TRUE")]),
            labels={"made-by": "slm-nightly"})
        vms = self._client()
        self.call("insert", lambda: vms.insert_unary(
            project=s.project, zone=self.zone, instance_resource=body), zone=self.zone)

    def repair(self, found: Found) -> None:
        """A missing grant is added; any other drift is the operator's to settle."""
        if self.misbuilt:
            raise GcpError(f"{self}: {'; '.join(self.misbuilt)} — delete it (`gcloud compute instances "
                           f"delete {self.name} --zone={self.zone}`) and run `gcp nodes` again")
        self._grant()

    def delete(self) -> None:
        s = self.spec
        self.call("delete", lambda: self._client().delete_unary(
            project=s.project, zone=self.zone, instance=self.name), zone=self.zone)


def node_vms(spec: GcpSpec, clients: Clients) -> list[NodeVm]:
    image = api_call("image family", lambda: newest_image(spec, clients))
    return [NodeVm(zone, name, spec, clients, image) for zone, name in instance_names(spec)]


def _image_name(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


class NodeImage(NodeVm):
    """`gcp upgrade`: a node whose boot disk was made from an older image of the family is
    made anew from the newest (an instance's boot image cannot change in place). Only a
    stopped node: a running one is in use by a night or a smoke, and is left for the next run."""

    kind = "node image"

    def read(self) -> Found:
        s = self.spec
        vm = get_or_none(str(self), lambda: self._client().get(
            project=s.project, zone=self.zone, instance=self.name))
        if vm is None:
            raise GcpError(f"{self}: no such instance — `slm-nightly gcp nodes` makes it")
        boot = next((d for d in vm.disks if d.boot), None)
        if boot is None:
            raise GcpError(f"{self}: the instance lists no boot disk")
        disk = api_call(str(self), lambda: self.clients.compute("DisksClient").get(
            project=s.project, zone=self.zone, disk=_image_name(boot.source)))
        have, want = _image_name(disk.source_image), self.image.name
        self.status = str(vm.status)
        return Found(True, [] if have == want else [f"image {have}, newest {want}"], have)

    def repair(self, found: Found) -> None:
        if self.status != "TERMINATED":
            raise GcpError(f"{self}: {self.status}, in use (a night, a smoke) — run `gcp "
                           "upgrade` again once it has stopped")
        self.delete()
        self.create()


def node_images(spec: GcpSpec, clients: Clients) -> list[NodeImage]:
    image = api_call("image family", lambda: newest_image(spec, clients))
    return [NodeImage(zone, name, spec, clients, image) for zone, name in instance_names(spec)]
