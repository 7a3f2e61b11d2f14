"""Networks, subnetworks, routers and firewalls of the networking fake: a mixin of NetworkState
(tests/fakes/compute_network.py, whose docstring lists the behaviour and its sources)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.fakes import compute_network_rules as rules
from tests.fakes.compute_network_rules import Call, Router, Subnetwork
from tests.fakes.compute_network_vm import Refused, need

if TYPE_CHECKING:
    from tests.fakes.compute_network import Host

Reply = tuple[int, dict[str, Any]]


class VpcVerbs:
    """Mixin: NetworkState provides these attributes and the shared helpers."""

    host: Host
    project: str
    base: str
    networks: dict[str, dict[str, Any]]
    subnets: dict[tuple[str, str], Subnetwork]
    routers: dict[tuple[str, str], Router]
    firewalls: dict[str, dict[str, Any]]
    addresses: dict[tuple[str, str], dict[str, Any]]
    _ids: Any

    check: Any
    operate: Any
    listing: Any
    mutable: Any
    new: Any
    network_of: Any
    in_use: Any
    _stamp: Any

    # ---- networks ------------------------------------------------------------------------
    def _network_json(self, name: str, auto: bool, description: str = "") -> dict[str, Any]:
        body = {"name": name, "autoCreateSubnetworks": auto, "description": description,
                "routingConfig": {"routingMode": "REGIONAL"}, "mtu": 1460,
                "networkFirewallPolicyEnforcementOrder": "AFTER_CLASSIC_FIREWALL"}
        return self._stamp(body, "network", f"global/networks/{name}")

    def _net_out(self, net: dict[str, Any]) -> dict[str, Any]:
        subs = [s.link(self.host.url) for s in self.subnets.values()
                if s.network == net["name"]]
        return {**net, "subnetworks": subs} if subs else dict(net)

    def _net_list(self, call: Call) -> Reply:
        err = self.check(call, "compute.networks.list", f"projects/{self.project}")
        return err or self.listing("network", "global/networks",
                                   [self._net_out(n) for n in self.networks.values()], call)

    def _net_get(self, call: Call, name: str) -> Reply:
        where = f"projects/{self.project}/global/networks/{name}"
        err = self.check(call, "compute.networks.get", where)
        if err or name not in self.networks:
            return err or rules.not_found(where)
        return 200, self._net_out(self.networks[name])

    def _net_insert(self, call: Call) -> Reply:
        body, name = call.body, call.body.get("name")
        err = (self.check(call, "compute.networks.create", f"projects/{self.project}")
               or rules.bad_name("name", name))
        if err:
            return err
        if "autoCreateSubnetworks" not in body:
            return rules.invalid("autoCreateSubnetworks", "", "Must be set: an unset value "
                                 "creates a legacy network, which this project cannot create.")
        where = f"projects/{self.project}/global/networks/{name}"
        err = self.new(where, name in self.networks)
        if err:
            return err
        net = self._network_json(name, bool(body["autoCreateSubnetworks"]),
                                 body.get("description", ""))
        net["id"] = str(next(self._ids))

        def create() -> None:
            self.networks[name] = net

        return self.operate(call, "insert", f"global/networks/{name}", net["id"], create)

    def _net_delete(self, call: Call, name: str) -> Reply:
        where = f"projects/{self.project}/global/networks/{name}"
        err = (self.check(call, "compute.networks.delete", where)
               or self.mutable(where, name in self.networks))
        if err:
            return err
        auto = self.networks[name]["autoCreateSubnetworks"]
        users = [f"projects/{self.project}/regions/{s.region}/subnetworks/{s.name}"
                 for s in self.subnets.values() if s.network == name
                 and not (auto and s.name == name)]
        users += [f"projects/{self.project}/global/firewalls/{f['name']}"
                  for f in self.firewalls.values() if f["network"].endswith(f"/{name}")]
        users += [f"projects/{self.project}/regions/{r.region}/routers/{r.name}"
                  for r in self.routers.values() if r.network.endswith(f"/{name}")]
        users += [i.resource() for i in self.host.instances.values()
                  if auto and i.subnetwork == name]

        def delete() -> None:
            self.networks.pop(name, None)
            for key in [k for k, s in self.subnets.items() if s.network == name]:
                self.subnets.pop(key)

        return self.operate(call, "delete", f"global/networks/{name}",
                            self.networks[name]["id"], delete, error=self.in_use(where, users))

    # ---- subnetworks ---------------------------------------------------------------------
    def sub_json(self, s: Subnetwork) -> dict[str, Any]:
        region = f"{self.base}/regions/{s.region}"
        out = {"kind": "compute#subnetwork", "id": str(s.id), "name": s.name,
               "creationTimestamp": rules.rfc3339(s.created),
               "network": f"{self.base}/global/networks/{s.network}",
               "ipCidrRange": s.ip_cidr_range,
               "gatewayAddress": str(rules.cidr(s.ip_cidr_range).network_address + 1),
               "region": region, "privateIpGoogleAccess": s.private_ip_google_access,
               "stackType": "IPV4_ONLY", "purpose": "PRIVATE",
               "fingerprint": f"fp-{s.id}", "selfLink": s.link(self.host.url)}
        if s.description:
            out["description"] = s.description
        return out

    def _sub_list(self, call: Call, region: str) -> Reply:
        err = self.check(call, "compute.subnetworks.list", f"projects/{self.project}")
        items = [self.sub_json(s) for (r, _), s in self.subnets.items() if r == region]
        return err or self.listing("subnetwork", f"regions/{region}/subnetworks", items, call)

    def _sub_get(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/subnetworks/{name}"
        err = self.check(call, "compute.subnetworks.get", where)
        sub = self.subnets.get((region, name))
        if err or sub is None:
            return err or rules.not_found(where)
        return 200, self.sub_json(sub)

    def _sub_insert(self, call: Call, region: str) -> Reply:
        body, name = call.body, call.body.get("name")
        where = f"projects/{self.project}/regions/{region}/subnetworks/{name}"
        err = self.check(call, "compute.subnetworks.create", where) or rules.bad_name(
            "name", name)
        if err:
            return err
        if str(body.get("region") or region).rsplit("/", 1)[-1] != region:
            return rules.invalid("region", body["region"], f"Must be {region}.")
        net, err = self.network_of(body.get("network"), "network")
        if err:
            return err
        others = [(s.name, s.region, s.ip_cidr_range) for s in self.subnets.values()
                  if s.network == net]
        err = (rules.subnet_range_error(body.get("ipCidrRange"),
                                        bool(self.networks[net]["autoCreateSubnetworks"]),
                                        others)
               or self.new(where, (region, name) in self.subnets))
        if err:
            return err
        sub = Subnetwork(self.project, region, name, bool(body.get("privateIpGoogleAccess")),
                         str(rules.cidr(body["ipCidrRange"])), net, next(self._ids),
                         description=body.get("description", ""))

        def create() -> None:
            self.subnets[(region, name)] = sub

        return self.operate(call, "insert", f"regions/{region}/subnetworks/{name}",
                            str(sub.id), create, region)

    def _sub_delete(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/subnetworks/{name}"
        sub = self.subnets.get((region, name))
        err = self.check(call, "compute.subnetworks.delete", where) or self.mutable(
            where, sub is not None)
        if err or sub is None:
            return err or rules.not_found(where)
        url = sub.link(self.host.url)
        users = [i.resource() for i in self.host.instances.values()
                 if i.region == region and i.subnetwork == name]
        users += [f"projects/{self.project}/regions/{region}/addresses/{a['name']}"
                  for (r, _), a in self.addresses.items()
                  if r == region and a.get("subnetwork") == url]

        def delete() -> None:
            self.subnets.pop((region, name), None)

        return self.operate(call, "delete", f"regions/{region}/subnetworks/{name}",
                            str(sub.id), delete, region, self.in_use(where, users))

    def _sub_pga(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/subnetworks/{name}"
        sub = self.subnets.get((region, name))
        err = (self.check(call, "compute.subnetworks.setPrivateIpGoogleAccess", where)
               or self.mutable(where, sub is not None))
        if err or sub is None:
            return err or rules.not_found(where)
        if not isinstance(call.body.get("privateIpGoogleAccess"), bool):
            return rules.required("privateIpGoogleAccess")
        value = call.body["privateIpGoogleAccess"]

        def flip() -> None:
            sub.private_ip_google_access = value

        return self.operate(call, "setPrivateIpGoogleAccess",
                            f"regions/{region}/subnetworks/{name}", str(sub.id), flip, region)

    # ---- routers -------------------------------------------------------------------------
    def router_json(self, r: Router) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "compute#router", "id": str(r.id), "name": r.name,
            "creationTimestamp": rules.rfc3339(r.created),
            "region": f"{self.base}/regions/{r.region}", "network": r.network,
            "selfLink": f"{self.base}/regions/{r.region}/routers/{r.name}"}
        if r.nats:
            out["nats"] = [dict(n) for n in r.nats]
        if r.bgp:
            out["bgp"] = dict(r.bgp)
        if r.description:
            out["description"] = r.description
        return out

    def _router_list(self, call: Call, region: str) -> Reply:
        err = self.check(call, "compute.routers.list", f"projects/{self.project}")
        items = [self.router_json(r) for (rg, _), r in self.routers.items() if rg == region]
        return err or self.listing("router", f"regions/{region}/routers", items, call)

    def _router_get(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/routers/{name}"
        err = self.check(call, "compute.routers.get", where)
        r = self.routers.get((region, name))
        if err or r is None:
            return err or rules.not_found(where)
        return 200, self.router_json(r)

    def _router_error(self, region: str, body: dict[str, Any]) -> Reply | None:
        """[nat] the router as a whole: network, bgp, NAT entries (unique names)."""
        net, err = self.network_of(body.get("network"), "network")
        if err:
            return err

        def subnet_ok(url: str | None) -> bool:
            _, r, s = rules.ref(url, "subnetworks")
            sub = self.subnets.get((r or region, s or ""))
            return r in (None, region) and sub is not None and sub.network == net

        nats = body.get("nats") or []
        for i, nat in enumerate(nats):
            err = rules.nat_error(i, nat, subnet_ok)
            if err:
                return err
        names = [n["name"] for n in nats]
        if len(set(names)) != len(names):
            return rules.invalid("nats", ",".join(names), "NAT names must be unique.")
        return rules.bgp_error(body.get("bgp"))

    def _router_insert(self, call: Call, region: str) -> Reply:
        body, name = call.body, call.body.get("name")
        where = f"projects/{self.project}/regions/{region}/routers/{name}"
        err = (self.check(call, "compute.routers.create", where)
               or rules.bad_name("name", name) or self._router_error(region, body)
               or self.new(where, (region, name) in self.routers))
        if err:
            return err
        net, _ = self.network_of(body["network"], "network")
        r = Router(self.project, region, name, f"{self.base}/global/networks/{net}",
                   [dict(n) for n in body.get("nats") or []], body.get("bgp"),
                   next(self._ids), description=body.get("description", ""))

        def create() -> None:
            self.routers[(region, name)] = r

        return self.operate(call, "insert", f"regions/{region}/routers/{name}", str(r.id),
                            create, region)

    def _router_patch(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/routers/{name}"
        r = self.routers.get((region, name))
        err = self.check(call, "compute.routers.update", where) or self.mutable(
            where, r is not None)
        if err or r is None:
            return err or rules.not_found(where)
        merged = rules.merge_patch(self.router_json(r), call.body)
        if merged.get("name") != name:
            return rules.invalid("name", merged.get("name", ""), "The name cannot be changed.")
        if merged.get("network") != r.network and rules.ref(merged.get("network"), "networks")[
                2] != rules.ref(r.network, "networks")[2]:
            return rules.invalid("network", merged.get("network", ""), "The network of a "
                                 "router cannot be changed.")  # constructed
        err = self._router_error(region, merged)
        if err:
            return err

        def apply() -> None:
            r.nats = [dict(n) for n in merged.get("nats") or []]
            r.bgp = merged.get("bgp")
            r.description = merged.get("description", "")

        return self.operate(call, "patch", f"regions/{region}/routers/{name}", str(r.id),
                            apply, region)

    def _router_delete(self, call: Call, region: str, name: str) -> Reply:
        where = f"projects/{self.project}/regions/{region}/routers/{name}"
        r = self.routers.get((region, name))
        err = self.check(call, "compute.routers.delete", where) or self.mutable(
            where, r is not None)
        if err or r is None:
            return err or rules.not_found(where)

        def delete() -> None:
            self.routers.pop((region, name), None)

        return self.operate(call, "delete", f"regions/{region}/routers/{name}", str(r.id),
                            delete, region)

    # ---- firewalls -----------------------------------------------------------------------
    def _fw_list(self, call: Call) -> Reply:
        err = self.check(call, "compute.firewalls.list", f"projects/{self.project}")
        return err or self.listing("firewall", "global/firewalls",
                                   list(self.firewalls.values()), call)

    def _fw_get(self, call: Call, name: str) -> Reply:
        where = f"projects/{self.project}/global/firewalls/{name}"
        err = self.check(call, "compute.firewalls.get", where)
        if err or name not in self.firewalls:
            return err or rules.not_found(where)
        return 200, self.firewalls[name]

    def _fw_rule(self, call: Call, body: dict[str, Any]) -> dict[str, Any]:
        """The rule a body makes: network resolved (absent: default), updatePolicy on it
        checked, validated [fw]; raises Refused."""
        body = rules.firewall_defaults(body)
        net, err = self.network_of(body.get("network") or "global/networks/default", "network")
        need(err)
        need(self.check(call, "compute.networks.updatePolicy",
                        f"projects/{self.project}/global/networks/{net}"))
        body["network"] = f"{self.base}/global/networks/{net}"
        need(rules.firewall_error(body))
        return {k: v for k, v in body.items() if v not in ([], "")}

    def _fw_insert(self, call: Call) -> Reply:
        name = call.body.get("name")
        where = f"projects/{self.project}/global/firewalls/{name}"
        try:
            need(self.check(call, "compute.firewalls.create", where))
            need(rules.bad_name("name", name))
            rule = self._fw_rule(call, call.body)
            need(self.new(where, name in self.firewalls))
        except Refused as r:
            return r.reply
        rule = self._stamp(rule, "firewall", f"global/firewalls/{name}")

        def create() -> None:
            self.firewalls[name] = rule

        return self.operate(call, "insert", f"global/firewalls/{name}", rule["id"], create)

    def _fw_replace(self, call: Call, name: str, body: dict[str, Any], verb: str) -> Reply:
        where = f"projects/{self.project}/global/firewalls/{name}"
        old = self.firewalls.get(name)
        try:
            need(self.check(call, "compute.firewalls.update", where))
            need(self.mutable(where, old is not None))
            body = body if verb == "update" else rules.merge_patch(old or {}, body)
            if body.get("name", name) != name:
                need(rules.invalid("name", body["name"], "The name cannot be changed."))
            rule = self._fw_rule(call, {**body, "name": name})
            if old and rule["network"] != old["network"]:
                need(rules.invalid("network", body.get("network"), "The network of a "
                                   "firewall rule cannot be changed."))  # constructed
        except Refused as r:
            return r.reply
        keep = {k: old[k] for k in ("kind", "id", "creationTimestamp", "selfLink")} if old else {}
        rule = {k: v for k, v in rule.items() if k not in keep} | keep

        def apply() -> None:
            self.firewalls[name] = rule

        return self.operate(call, verb, f"global/firewalls/{name}", keep.get("id", ""), apply)

    def _fw_update(self, call: Call, name: str) -> Reply:
        return self._fw_replace(call, name, call.body, "update")

    def _fw_patch(self, call: Call, name: str) -> Reply:
        return self._fw_replace(call, name, call.body, "patch")

    def _fw_delete(self, call: Call, name: str) -> Reply:
        where = f"projects/{self.project}/global/firewalls/{name}"
        rule = self.firewalls.get(name)
        err = self.check(call, "compute.firewalls.delete", where) or self.mutable(
            where, rule is not None)
        if err or rule is None:
            return err or rules.not_found(where)
        net = rule["network"].rsplit("/", 1)[-1]
        err = self.check(call, "compute.networks.updatePolicy",
                         f"projects/{self.project}/global/networks/{net}")
        if err:
            return err

        def delete() -> None:
            self.firewalls.pop(name, None)

        return self.operate(call, "delete", f"global/firewalls/{name}", rule["id"], delete)
