"""The half of the networking fake (tests/fakes/compute_network.py, whose docstring lists the
sources) that serves addresses, images and instances.insert/delete: a mixin of
NetworkState.

instances.insert [ref-instances] builds a FakeInstance of the engine (tests/fakes/
compute_engine.py), visible at once as PROVISIONING, STAGING when its zone operation runs,
RUNNING `boot_seconds` later (the operation DONE then), so the engine's start/stop, node
runtime and max run duration apply to it as to add_instance's. Checked, in the API's order:
compute.instances.create; the body (name, machineType, one boot disk from an image, nic0,
scheduling); the image (404; OBSOLETE/DELETED refused; compute.images.useReadOnly on an image
of this project), diskSizeGb not below the image's ("Requested disk size cannot be smaller
than the image size (N GB)", PR BasedHardware/omi#7155), compute.disks.create, the subnet
(404; compute.subnetworks.use, compute.subnetworks.useExternalIp with accessConfigs),
compute.instances.setMetadata / setTags / setServiceAccount when given, and
iam.serviceAccounts.actAs on the instance's service account: without it a 400 "The user does
not have access to service account 'E'. User: 'U'. Ask a project owner to grant you the
iam.serviceAccountUser role on the service account" (the text gcloud and Terraform print for
VMs and GKE nodes); an instance or boot disk of that name → 409 alreadyExists. Permissions
from "Create a VM that uses a user-managed service account" (cloud.google.com/compute/docs/
access/create-enable-service-accounts-for-instances, "Required permissions") and the audit
log of an insert (compute.instances.create, compute.disks.create, compute.subnetworks.use).

networkIP: what a VM is given from its subnet, under the engine's rule that a node's "VPC IP"
is a loopback address so what it serves is reachable: absent → 127.0.0.1, a 127.x.y.z is
kept (distinct nodes on one port), any other address must be a free host of the subnet's
range (400 otherwise) and is kept as given — not reachable, but what an address reservation
and the firewall check see. accessConfigs → an external IP from 203.0.113.0/24.

Disks: the boot disk from an image (first), then any blank disks (initializeParams without a
sourceImage: the image builder's scratch disk), each with compute.disks.create.

instances.delete: compute.instances.delete; STOPPING now, gone (with its autoDelete disks; the
others are detached and kept) when the operation is DONE.

images.insert [images-insert] from a zonal disk (sourceDisk): compute.images.create and
compute.disks.useReadOnly; a disk whose instance is not TERMINATED is refused without
forceCreate=true (400 resourceInUseByAnotherResource, "The disk resource '…' is already being
used by '…'"); labels as "Requirements for labels" (cloud.google.com/compute/docs/
labeling-resources) says; the image exists (READY, in its family) when the operation is DONE,
with the disk's size. Source: cloud.google.com/compute/docs/reference/rest/v1/images/insert and
"Create custom images" (cloud.google.com/compute/docs/images/create-custom: "stop the VM … or
use --force").
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import time
from typing import TYPE_CHECKING, Any

from tests.fakes import compute_network_rules as rules

if TYPE_CHECKING:
    from tests.fakes.compute_network import Host
    from tests.fakes.compute_network_rules import Call, Image, Subnetwork
    from tests.fakes.gcp_project import FakeProject

Reply = tuple[int, dict[str, Any]]

DISK_TYPES = {"pd-standard", "pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced",
              "hyperdisk-extreme", "hyperdisk-throughput", "hyperdisk-ml"}
# a G2 comes with its L4s attached (cloud.google.com/compute/docs/gpus#l4-gpus)
G2_GPUS = {"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1,
           "g2-standard-24": 2, "g2-standard-32": 1, "g2-standard-48": 4, "g2-standard-96": 8}
EXTERNAL_POOL = ipaddress.ip_network("203.0.113.0/24")
FIELD = "Invalid value for field 'resource.{}': '{}'. "
MIN_RUN, MAX_RUN = 30, 120 * 86400


class Refused(Exception):
    """A check's reply, raised so a many-step insert reads top to bottom."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.reply = reply


def need(reply: Reply | None) -> None:
    if reply is not None:
        raise Refused(reply)


class VmVerbs:
    """Mixin: NetworkState provides these attributes and the shared helpers."""

    host: Host
    gcp: FakeProject | None
    project: str
    base: str
    networks: dict[str, dict[str, Any]]
    subnets: dict[tuple[str, str], Subnetwork]
    firewalls: dict[str, dict[str, Any]]
    addresses: dict[tuple[str, str], dict[str, Any]]
    images: dict[tuple[str, str], Image]
    disks: dict[tuple[str, str], dict[str, Any]]
    busy: set[str]

    check: Any
    operate: Any
    listing: Any
    mutable: Any
    new: Any
    network_of: Any
    subnet: Any
    _stamp: Any

    # ---- addresses -----------------------------------------------------------------------
    def _taken(self, region: str, sub: str | None) -> set[str]:
        """The IPs reserved or used in a subnet (sub None: the external pool)."""
        out = {a["address"] for (r, _), a in self.addresses.items()
               if (sub is None and a["addressType"] == "EXTERNAL")
               or (r == region and a.get("subnetwork", "").endswith(f"/subnetworks/{sub}"))}
        for inst in self.host.instances.values():
            if sub is None and inst.external_ip:
                out.add(inst.external_ip)
            elif inst.region == region and inst.subnetwork == sub:
                out.add(inst.network_ip)
        return out

    def _free_ip(self, region: str, sub: Subnetwork | None) -> str:
        pool = (rules.usable_hosts(sub.ip_cidr_range) if sub else
                [str(h) for h in EXTERNAL_POOL.hosts()])
        taken = self._taken(region, sub.name if sub else None)
        return next(ip for ip in pool if ip not in taken)

    def _in_subnet(self, field_: str, ip: str, sub: Subnetwork, region: str,
                   instance: bool) -> None:
        """`ip` a usable host of the subnet that no instance has; a reservation's IP is free
        for an instance (that is what reserving it is for), not for another reservation."""
        if ip not in rules.usable_hosts(sub.ip_cidr_range):
            need(rules.invalid(field_, ip, "Specified IP address is not within the IP range "
                               "of the subnetwork."))  # constructed
        used = {i.network_ip for i in self.host.instances.values()
                if i.region == region and i.subnetwork == sub.name}
        if not instance:
            used |= self._taken(region, sub.name)
        if ip in used:
            need(rules.invalid(field_, ip, f"IP address '{ip}' is already being used by "
                               "another resource."))  # constructed

    def _addr_out(self, a: dict[str, Any], region: str) -> dict[str, Any]:
        users = [i.link(self.host.url) for i in self.host.instances.values()
                 if i.region == region and a["address"] in (i.network_ip, i.external_ip)
                 and (a["addressType"] == "EXTERNAL"
                      or a.get("subnetwork", "").endswith(f"/subnetworks/{i.subnetwork}"))]
        return {**a, "status": "IN_USE", "users": users} if users else dict(a)

    def _addr_list(self, call: Call, region: str) -> Reply:
        err = self.check(call, "compute.addresses.list", f"projects/{self.project}")
        items = [self._addr_out(a, r) for (r, _), a in self.addresses.items() if r == region]
        return err or self.listing("address", f"regions/{region}/addresses", items, call)

    def _addr_get(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/addresses/{name}"
        err = self.check(call, "compute.addresses.get", where)
        a = self.addresses.get((region, name))
        if err or a is None:
            return err or rules.not_found(where)
        return 200, self._addr_out(a, region)

    def _addr_body(self, call: Call, region: str) -> dict[str, Any]:
        body = call.body
        kind = body.get("addressType") or "EXTERNAL"
        if kind not in ("INTERNAL", "EXTERNAL"):
            need(rules.invalid("addressType", kind, "Must be one of [EXTERNAL, INTERNAL]."))
        if str(body.get("region") or region).rsplit("/", 1)[-1] != region:
            need(rules.invalid("region", body["region"], f"Must be {region}."))
        out = {"name": body["name"], "addressType": kind, "ipVersion": "IPV4",
               "region": f"{self.base}/regions/{region}", "status": "RESERVED",
               "description": body.get("description", "")}
        if kind == "EXTERNAL":
            if body.get("subnetwork"):
                need(rules.invalid("subnetwork", body["subnetwork"], "A subnetwork can only "
                                   "be given for an INTERNAL address."))  # constructed
            return out | {"address": body.get("address") or self._free_ip(region, None),
                          "networkTier": "PREMIUM"}
        _, r, s = rules.ref(body.get("subnetwork"), "subnetworks")
        if not body.get("subnetwork"):
            need(rules.required("subnetwork"))
        sub = self.subnets.get((r or region, s or ""))
        if sub is None or r not in (None, region):
            need(rules.not_found(f"projects/{self.project}/regions/{r or region}/"
                                 f"subnetworks/{s}"))
        ip = body.get("address")
        if ip:
            self._in_subnet("address", ip, sub, region, instance=False)
        return out | {"address": ip or self._free_ip(region, sub), "purpose": "GCE_ENDPOINT",
                      "subnetwork": sub.link(self.host.url),
                      "network": f"{self.base}/global/networks/{sub.network}",
                      "prefixLength": 32}

    def _addr_insert(self, call: Call, region: str) -> Reply:
        name = call.body.get("name")
        where = f"projects/{self.project}/regions/{region}/addresses/{name}"
        internal = call.body.get("addressType") == "INTERNAL"
        try:
            need(self.check(call, "compute.addresses.createInternal" if internal
                            else "compute.addresses.create", where))
            need(rules.bad_name("name", name))
            a = self._addr_body(call, region)
            need(self.new(where, (region, name) in self.addresses))
        except Refused as r:
            return r.reply
        a = self._stamp({k: v for k, v in a.items() if v != ""}, "address",
                        f"regions/{region}/addresses/{name}")

        def create() -> None:
            self.addresses[(region, name)] = a

        return self.operate(call, "insert", f"regions/{region}/addresses/{name}", a["id"],
                            create, region)

    def _addr_delete(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/addresses/{name}"
        a = self.addresses.get((region, name))
        err = self.check(call, "compute.addresses.delete", where) or self.mutable(
            where, a is not None)
        if err or a is None:
            return err or rules.not_found(where)

        def delete() -> None:
            self.addresses.pop((region, name), None)

        return self.operate(call, "delete", f"regions/{region}/addresses/{name}", a["id"],
                            delete, region)

    # ---- images [images] -----------------------------------------------------------------
    def image_json(self, img: Image) -> dict[str, Any]:
        link = f"{self.host.url}/compute/v1/projects/{img.project}/global/images/{img.name}"
        out: dict[str, Any] = {
            "kind": "compute#image", "id": str(img.id), "name": img.name,
            "creationTimestamp": rules.rfc3339(img.created), "diskSizeGb": str(img.disk_size_gb),
            "status": "READY", "sourceType": "RAW", "architecture": "X86_64",
            "archiveSizeBytes": str(img.disk_size_gb * 2**28), "selfLink": link}
        if img.family:
            out["family"] = img.family
        if img.labels:
            out["labels"] = dict(img.labels)
        if img.description:
            out["description"] = img.description
        if img.source_disk:
            out["sourceDisk"] = img.source_disk
        if img.deprecated:
            out["deprecated"] = {"state": img.deprecated}
        return out

    def _image_check(self, call: Call, permission: str, where: str) -> Reply | None:
        """Another project's images are public images: any authenticated caller reads them."""
        if call.project != self.project:
            return None
        return self.check(call, permission, where)

    def _image_list(self, call: Call) -> Reply:
        err = self._image_check(call, "compute.images.list", f"projects/{call.project}")
        items = [self.image_json(i) for (p, _), i in self.images.items() if p == call.project]
        return err or self.listing("image", "global/images", items, call)

    def _image_get(self, call: Call, name: str) -> Reply:
        where = f"projects/{call.project}/global/images/{name}"
        err = self._image_check(call, "compute.images.get", where)
        img = self.images.get((call.project, name))
        if err or img is None:
            return err or rules.not_found(where)
        return 200, self.image_json(img)

    def family_image(self, project: str, family: str) -> Image | None:
        """The newest image of the family with no deprecation state."""
        live = [i for (p, _), i in self.images.items()
                if p == project and i.family == family and i.deprecated is None]
        return max(live, key=lambda i: (i.created, i.id), default=None)

    def _image_family(self, call: Call, family: str) -> Reply:
        where = f"projects/{call.project}/global/images/family/{family}"
        err = self._image_check(call, "compute.images.getFromFamily", where)
        img = self.family_image(call.project, family)
        if err or img is None:
            return err or rules.not_found(where)
        return 200, self.image_json(img)

    def _image_insert(self, call: Call) -> Reply:
        """[images-insert] images.insert from a zonal disk: compute.images.create on the image,
        compute.disks.useReadOnly on the disk; a disk attached to a RUNNING instance is refused
        unless forceCreate=true ("resourceInUseByAnotherResource"); labels as [labels] says; the
        image is READY (getFromFamily sees it) when the operation is DONE, its diskSizeGb the
        disk's size."""
        from tests.fakes.compute_network_rules import Image

        body, name = call.body, call.body.get("name")
        where = f"projects/{self.project}/global/images/{name}"
        try:
            need(self.check(call, "compute.images.create", where))
            need(rules.bad_name("name", name))
            if body.get("family"):
                need(rules.bad_name("family", body["family"]))
            need(_labels_error(body.get("labels") or {}))
            if not body.get("sourceDisk"):
                need(rules.required("sourceDisk"))  # the only source the fake models
            m = re.search(r"zones/([^/]+)/disks/([^/]+)$", body["sourceDisk"])
            disk = self.disks.get((m.group(1), m.group(2))) if m else None
            disk_where = (f"projects/{self.project}/zones/{m.group(1)}/disks/{m.group(2)}"
                          if m else str(body["sourceDisk"]))
            if disk is None:
                need(rules.not_found(disk_where))
            need(self.check(call, "compute.disks.useReadOnly", disk_where))
            need(rules.exists(where) if (self.project, name) in self.images else None)
            user = self.host.instances.get((m.group(1), disk["user"])) if disk["user"] else None
            force = (call.query.get("forceCreate") or ["false"])[0].lower() == "true"
            if user is not None and user.status != "TERMINATED" and not force:
                need(rules.cerror(400, f"The disk resource '{disk_where}' is already being "
                                  f"used by 'projects/{self.project}/zones/{m.group(1)}/"
                                  f"instances/{user.name}'", "resourceInUseByAnotherResource"))
        except Refused as r:
            return r.reply
        image_id = next(self._ids)

        def ready() -> None:
            self.images[(self.project, name)] = Image(
                self.project, name, body.get("family"), int(disk["sizeGb"]), time.time(),
                None, image_id, dict(body.get("labels") or {}), body.get("description") or "",
                f"{self.host.url}/compute/v1/{disk_where}")

        return self.operate(call, "insert", f"global/images/{name}", str(image_id), ready)

    def _source_image(self, call: Call, i: int, value: str | None) -> Image:
        field_ = f"disks[{i}].initializeParams.sourceImage"
        if not value:
            need(rules.required(field_))
        fam = re.search(r"(?:projects/([^/]+)/)?global/images/family/([^/]+)$", value)
        project, _, name = rules.ref(value, "images")
        project = (fam.group(1) if fam else project) or self.project
        img = (self.family_image(project, fam.group(2)) if fam
               else self.images.get((project, name or "")))
        where = (f"projects/{project}/global/images/family/{fam.group(2)}" if fam
                 else f"projects/{project}/global/images/{name}")
        if img is None:
            need(rules.not_found(where))
        if img.deprecated in ("OBSOLETE", "DELETED"):
            need(rules.invalid(field_, value, f"The image resource '{where}' is "
                               f"{img.deprecated} and cannot be used."))  # constructed
        if project == self.project:
            need(self.check(call, "compute.images.useReadOnly",
                            f"projects/{project}/global/images/{img.name}"))
        return img

    # ---- instances.insert / delete [ref-instances] ---------------------------------------
    def _disks(self, call: Call, body: dict[str, Any], zone: str) -> list[dict[str, Any]]:
        """The boot disk from an image, then any blank disks (initializeParams without a
        sourceImage: an image builder's scratch disk); each checked for compute.disks.create and
        a free name."""
        disks = body.get("disks") or []
        boots = [i for i, d in enumerate(disks) if d.get("boot")]
        if len(boots) != 1 or boots[0] != 0:
            need(rules.invalid("disks", "", "Exactly one boot disk, the first, is modelled "
                               "by the fake."))
        out = []
        for i, d in enumerate(disks):
            init = d.get("initializeParams") or {}
            if d.get("source") or not init:
                need(rules.required(f"disks[{i}].initializeParams"))
            img = self._source_image(call, i, init.get("sourceImage")) if i == 0 else None
            if i and init.get("sourceImage"):
                need(rules.invalid(f"disks[{i}].initializeParams.sourceImage", "", "Only "
                                   "blank additional disks are modelled by the fake."))
            size = int(init.get("diskSizeGb") or (img.disk_size_gb if img else 0))
            if img is not None and size < img.disk_size_gb:
                need(rules.invalid(f"disks[{i}].initializeParams.diskSizeGb", size, "Requested "
                                   "disk size cannot be smaller than the image size "
                                   f"({img.disk_size_gb} GB)"))
            if img is None and size < 1:
                need(rules.required(f"disks[{i}].initializeParams.diskSizeGb"))
            m = re.search(r"(?:zones/([^/]+)/)?diskTypes/([^/]+)$", init.get("diskType") or
                          "diskTypes/pd-standard")
            if m is None or m.group(1) not in (None, zone) or m.group(2) not in DISK_TYPES:
                need(rules.not_found(f"projects/{self.project}/zones/{zone}/diskTypes/"
                                     f"{(m and m.group(2)) or init.get('diskType')}"))
            disk = init.get("diskName") or (body["name"] if i == 0 else
                                            f"{body['name']}-{i}")
            where = f"projects/{self.project}/zones/{zone}/disks/{disk}"
            need(self.check(call, "compute.disks.create", where))
            taken = (zone, disk) in self.disks or any(o["name"] == disk for o in out)
            need(rules.exists(where) if taken else None)
            out.append({"name": disk, "sizeGb": size, "type": m.group(2),
                        "image": img.name if img else None,
                        "imageProject": img.project if img else None, "boot": i == 0,
                        "deviceName": d.get("deviceName") or disk,
                        "autoDelete": d.get("autoDelete", True), "user": body["name"]})
        return out

    def _nic_subnet(self, nic: dict[str, Any], region: str) -> Subnetwork:
        field_ = "networkInterfaces[0]"
        if nic.get("subnetwork"):
            project, r, s = rules.ref(nic["subnetwork"], "subnetworks")
            sub = self.subnets.get((r or region, s or ""))
            if sub is None or (project or self.project) != self.project:
                need(rules.not_found(f"projects/{project or self.project}/regions/"
                                     f"{r or region}/subnetworks/{s}"))
            if r not in (None, region):
                need(rules.invalid(f"{field_}.subnetwork", nic["subnetwork"], "Subnetwork "
                                   "must be in the instance's region."))  # constructed
            return sub
        net, err = self.network_of(nic.get("network") or "global/networks/default",
                                   f"{field_}.network")
        need(err)
        if not self.networks[net]["autoCreateSubnetworks"]:
            need(rules.invalid(field_, "", "Subnetwork should be specified for custom "
                               "subnetmode network"))
        return self.subnet(region, net)

    def _nic(self, call: Call, body: dict[str, Any], region: str) -> dict[str, Any]:
        nics = body.get("networkInterfaces") or []
        if len(nics) != 1:
            need(rules.required("networkInterfaces") if not nics else rules.invalid(
                "networkInterfaces", "", "One network interface is modelled by the fake."))
        nic = nics[0]
        sub = self._nic_subnet(nic, region)
        where = f"projects/{self.project}/regions/{region}/subnetworks/{sub.name}"
        need(self.check(call, "compute.subnetworks.use", where))
        external = None
        if nic.get("accessConfigs"):
            need(self.check(call, "compute.subnetworks.useExternalIp", where))
            external = nic["accessConfigs"][0].get("natIP") or self._free_ip(region, None)
        ip = nic.get("networkIP") or "127.0.0.1"
        if not ip.startswith("127."):
            self._in_subnet("networkInterfaces[0].networkIP", ip, sub, region, instance=True)
        return {"subnetwork": sub.name, "network_ip": ip, "external_ip": external}

    @staticmethod
    def _machine(body: dict[str, Any], zone: str) -> tuple[str, list[tuple[str, int]]]:
        value = body.get("machineType")
        if not value:
            need(rules.required("machineType"))
        m = re.search(r"(?:zones/([^/]+)/)?machineTypes/([a-z0-9-]+)$", value)
        if m is None or m.group(1) not in (None, zone):
            need(rules.invalid("machineType", value, "Must be a machine type of zone "
                               f"{zone}."))  # constructed
        mt = m.group(2)
        if mt in G2_GPUS:
            return mt, [("nvidia-l4", G2_GPUS[mt])]
        return mt, [(str(a.get("acceleratorType", "")).rsplit("/", 1)[-1],
                     int(a.get("acceleratorCount", 1)))
                    for a in body.get("guestAccelerators") or []]

    @staticmethod
    def _scheduling(body: dict[str, Any], gpus: bool) -> dict[str, Any]:
        """[ref-instances] Scheduling's defaults for the provisioning model, validated as the
        engine validates setScheduling (the same error texts)."""
        s = body.get("scheduling") or {}
        model = s.get("provisioningModel") or ("SPOT" if s.get("preemptible") else "STANDARD")
        spot = model == "SPOT"
        out = {"provisioning_model": model, "preemptible": bool(s.get("preemptible", spot)),
               "automatic_restart": s.get("automaticRestart", not spot),
               "on_host_maintenance": s.get("onHostMaintenance",
                                            "TERMINATE" if spot else "MIGRATE"),
               "termination_action": s.get("instanceTerminationAction",
                                           "STOP" if spot else None),
               "max_run_seconds": (int(s["maxRunDuration"]["seconds"])
                                   if s.get("maxRunDuration") else None)}
        if out["preemptible"] and not spot:
            need(rules.invalid("scheduling.provisioningModel", model, "For preemptible, only "
                               "allowed provisioning_model value is SPOT."))
        if spot and out["automatic_restart"]:
            need(rules.invalid("scheduling.automaticRestart", "true", "Preemptible and Spot "
                               "instances cannot be automatically restarted."))
        if gpus and out["on_host_maintenance"] == "MIGRATE":
            need(rules.cerror(400, "Instances with guest accelerators do not support live "
                              "migration.", "badRequest"))
        mrd = out["max_run_seconds"]
        if mrd is not None and not MIN_RUN <= mrd <= MAX_RUN:
            need(rules.invalid("scheduling.maxRunDuration.seconds", mrd,
                               f"Must be between {MIN_RUN} and {MAX_RUN}."))
        if out["termination_action"] and not spot and mrd is None:
            need(rules.invalid("scheduling.instanceTerminationAction",
                               out["termination_action"], "You cannot specify a termination "
                               "action for a VM instance that has the standard provisioning "
                               "model (default). To use instance termination action, the VM "
                               "instance must use the Spot or Reservation-Bound provisioning "
                               "model."))
        return out

    def _identity(self, call: Call, body: dict[str, Any], where: str) -> dict[str, Any]:
        """Service account (+ actAs), metadata and tags, with their permissions."""
        sas = body.get("serviceAccounts") or []
        if len(sas) > 1:
            need(rules.invalid("serviceAccounts", "", "At most one service account."))
        sa = sas[0].get("email") if sas else None
        if sa == "default":
            number = self.gcp.number if self.gcp else 123456789012
            sa = f"{number}-compute@developer.gserviceaccount.com"
        if sa:
            need(self.check(call, "compute.instances.setServiceAccount", where))
            if not self.host.allowed(call.member, "iam.serviceAccounts.actAs",
                                     f"projects/{self.project}/serviceAccounts/{sa}"):
                need(rules.cerror(400, f"The user does not have access to service account "
                                  f"'{sa}'. User: '{rules.email(call.member)}'. Ask a project "
                                  "owner to grant you the iam.serviceAccountUser role on the "
                                  "service account", "badRequest"))
        items = (body.get("metadata") or {}).get("items") or []
        if items:
            need(self.check(call, "compute.instances.setMetadata", where))
        tags = (body.get("tags") or {}).get("items") or []
        if tags:
            need(self.check(call, "compute.instances.setTags", where))
            for i, tag in enumerate(tags):
                need(rules.bad_name(f"tags.items[{i}]", tag))
        return {"service_account": sa, "tags": list(tags),
                "metadata": {m["key"]: m.get("value", "") for m in items}}

    def _vm_insert(self, call: Call, zone: str) -> Reply:
        body, name = call.body, call.body.get("name")
        where = f"projects/{self.project}/zones/{zone}/instances/{name}"
        region = zone.rsplit("-", 1)[0]
        try:
            need(self.check(call, "compute.instances.create", where))
            need(rules.bad_name("name", name))
            machine, gpus = self._machine(body, zone)
            sched = self._scheduling(body, bool(gpus))
            disks = self._disks(call, body, zone)
            nic = self._nic(call, body, region)
            ident = self._identity(call, body, where)
            need(rules.exists(where) if (zone, name) in self.host.instances else None)
        except Refused as r:
            return r.reply
        return self._create_vm(call, zone, name, machine, gpus, sched | nic | ident, disks)

    def _create_vm(self, call: Call, zone: str, name: str, machine: str,
                   gpus: list[tuple[str, int]], fields: dict[str, Any],
                   disks: list[dict[str, Any]]) -> Reply:
        from tests.fakes.compute_engine import FakeInstance  # the engine imports this module

        host = self.host
        inst = FakeInstance(self.project, zone, name, next(host._seq), status="PROVISIONING",
                            machine_type=machine, accelerators=gpus, **fields)
        if gpus and (zone, inst.provisioning_model) in host.stockouts:
            # an insert the zone has no GPU for ends DONE with ZONE_RESOURCE_POOL_EXHAUSTED, as a
            # start does (compute_engine.py _start_error), and nothing is made
            now = time.time() + host.op_pending_seconds
            op = host._new_op(inst, "insert", now, now, rules.email(call.member))
            op.error = host._start_error(inst, "stockout")
            return 200, host._op_json(op)
        inst.metadata_fingerprint = "fp-" + hashlib.sha256(json.dumps(
            inst.metadata, sort_keys=True).encode()).hexdigest()[:12]
        host.instances[(zone, name)] = inst
        for disk in disks:
            self.disks[(zone, disk["name"])] = disk
        now = time.time()
        pending = now + host.op_pending_seconds
        op = host._new_op(inst, "insert", pending, pending + inst.boot_seconds,
                          rules.email(call.member))
        gen = inst.generation

        def staging() -> None:
            if inst.generation == gen:
                inst.status = "STAGING"

        def running() -> None:
            if inst.generation == gen:
                host._enter_running(inst)

        host._at(pending, staging)
        host._at(pending + inst.boot_seconds, running)
        return 200, host._op_json(op)

    def _disk_get(self, call: Call, zone: str, name: str) -> Reply:
        """disks.get [ref disks/get]: size, type, the image it was made from (sourceImage), the
        instances using it (users)."""
        where = f"projects/{self.project}/zones/{zone}/disks/{name}"
        err = self.check(call, "compute.disks.get", where)
        d = self.disks.get((zone, name))
        if err or d is None:
            return err or rules.not_found(where)
        base = f"{self.host.url}/compute/v1/projects"
        return 200, {
            "kind": "compute#disk", "name": d["name"], "sizeGb": str(d["sizeGb"]),
            "zone": f"{base}/{self.project}/zones/{zone}",
            "type": f"{base}/{self.project}/zones/{zone}/diskTypes/{d['type']}",
            **({"sourceImage": f"{base}/{d['imageProject']}/global/images/{d['image']}"}
               if d.get("image") else {}),
            "users": ([f"{base}/{self.project}/zones/{zone}/instances/{d['user']}"]
                      if d["user"] else []),
            "selfLink": f"{base}/{self.project}/zones/{zone}/disks/{d['name']}"}

    def _vm_delete(self, call: Call, zone: str, name: str) -> Reply:
        host = self.host
        where = f"projects/{self.project}/zones/{zone}/instances/{name}"
        inst = host.instances.get((zone, name))
        err = self.check(call, "compute.instances.delete", where) or self.mutable(
            where, inst is not None)
        if err or inst is None:
            return err or rules.not_found(where)
        now = time.time()
        pending = now + host.op_pending_seconds
        op = host._new_op(inst, "delete", pending, pending + host.stop_seconds,
                          rules.email(call.member))
        inst.generation += 1  # a boot in flight never finishes
        if inst.status != "TERMINATED":
            host._leave_running(inst, "STOPPING")
        self.busy.add(where)

        def gone() -> None:
            self.busy.discard(where)
            if host.instances.get((zone, name)) is inst:
                del host.instances[(zone, name)]
            for key, d in list(self.disks.items()):
                if key[0] == zone and d["user"] == name:
                    if d["autoDelete"]:
                        del self.disks[key]
                    else:
                        d["user"] = None  # detached, kept (and billed)

        host._at(pending + host.stop_seconds, gone)
        return 200, host._op_json(op)

    def delete_now(self, inst: Any) -> None:
        """[limit] instanceTerminationAction DELETE at the end of maxRunDuration: the instance
        and its autoDelete disks are gone (Compute's own action: no caller, no permission)."""
        host = self.host
        inst.generation += 1
        if inst.status != "TERMINATED":
            host._leave_running(inst, "TERMINATED")
        host.instances.pop((inst.zone, inst.name), None)
        for key, d in list(self.disks.items()):
            if key[0] == inst.zone and d["user"] == inst.name:
                if d["autoDelete"]:
                    del self.disks[key]
                else:
                    d["user"] = None


_LABEL = re.compile(r"[a-z0-9_-]{0,63}")


def _labels_error(labels: dict[str, Any]) -> Reply | None:
    """[labels] "Requirements for labels" (cloud.google.com/compute/docs/labeling-resources):
    at most 64; keys start with a lowercase letter; keys and values at most 63 characters of
    lowercase letters, digits, underscores and dashes (the API's message, not its exact text
    for every case)."""
    if len(labels) > 64:
        return rules.invalid("labels", "", "At most 64 labels.")
    for k, v in labels.items():
        if not (k[:1].islower() and _LABEL.fullmatch(k) and _LABEL.fullmatch(str(v))):
            return rules.invalid("labels", "", f"Label key '{k}' or value '{v}' violates format "
                                 "constraints. The key and the value can only contain lowercase "
                                 "letters, numeric characters, underscores and dashes, at most "
                                 "63 characters; the key must start with a lowercase letter.")
    return None
