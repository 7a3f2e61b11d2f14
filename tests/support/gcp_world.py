"""An empty Google Cloud project at the wire: every API fake `slm-nightly gcp` calls, on one
shared FakeProject (tests/fakes/gcp_project.py), and the Clients that reach them — the real
Google client libraries, as the operator's laptop runs them, only the endpoints moved."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.gcp.clients import Clients
from tasks.gcp.spec import GcpSpec, spec_from_profile
from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.gcp_iam import FakeIam, FakeResourceManager
from tests.fakes.gcp_project import FakeProject, TokenEndpoint
from tests.fakes.gcp_secrets import FakeSecrets
from tests.fakes.gcp_services import FakeCloudQuotas, FakeServiceUsage
from tests.fakes.gcs import GcsEmulator, service_account
from tests.fakes.gcs_iam import GcsIamProxy

PROJECT = "slm-test-project"
BUCKET = "slm-test-bucket"


@dataclass
class World:
    gcp: FakeProject
    compute: FakeComputeEngine
    iam: FakeIam
    rm: FakeResourceManager
    secrets: FakeSecrets
    services: FakeServiceUsage
    quotas: FakeCloudQuotas
    storage: GcsIamProxy
    tokens: TokenEndpoint
    tmp: Path

    def endpoints(self) -> dict[str, str]:
        return {"compute": self.compute.url, "iam": self.iam.url, "resourcemanager": self.rm.url,
                "secretmanager": self.secrets.url, "serviceusage": self.services.url,
                "cloudquotas": self.quotas.url, "storage": self.storage.url}

    def clients(self, member: str | None = None) -> Clients:
        """Clients acting as `member` (default: the project's owner, who runs setup)."""
        from google.oauth2.credentials import Credentials

        token = self.gcp.token_for(member or self.gcp.owner)
        return Clients(Credentials(token=token), self.endpoints(), project=PROJECT)

    def key_file(self, email: str) -> Path:
        """A service-account key for `email` whose tokens come from the fake token endpoint:
        GOOGLE_APPLICATION_CREDENTIALS for a subprocess that acts as it."""
        path = self.tmp / f"{email.split('@')[0]}.json"
        info = service_account(self.tokens.url, email)
        info["project_id"] = PROJECT
        path.write_text(json.dumps(info))
        return path

    def env(self, email: str) -> dict[str, str]:
        return {"GOOGLE_APPLICATION_CREDENTIALS": str(self.key_file(email)),
                "SLM_GCP_API_ENDPOINTS": json.dumps(self.endpoints())}


@contextmanager
def empty_project(tmp: Path, storage_env: bool = True, **compute: Any) -> Iterator[World]:
    """A new project: the default services on, nothing else; its owner `user:operator@…`.
    `storage_env` False: $STORAGE_EMULATOR_HOST stays what it was (the bucket proxy points it
    at itself while entered, for clients without an endpoint, which a test with a storage
    emulator of its own does not want)."""
    gcp = FakeProject(PROJECT)
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    with ExitStack() as stack:
        iam = stack.enter_context(FakeIam(gcp))
        (tmp / "gcs").mkdir(parents=True, exist_ok=True)
        gcs = stack.enter_context(GcsEmulator(tmp / "gcs"))
        world = World(
            gcp=gcp,
            compute=stack.enter_context(FakeComputeEngine(project=PROJECT, gcp=gcp, **compute)),
            iam=iam,
            rm=stack.enter_context(FakeResourceManager(gcp, iam)),
            secrets=stack.enter_context(FakeSecrets(gcp, iam)),
            services=stack.enter_context(FakeServiceUsage(gcp)),
            quotas=stack.enter_context(FakeCloudQuotas(gcp)),
            storage=stack.enter_context(GcsIamProxy(gcs, gcp)),
            tokens=stack.enter_context(TokenEndpoint(gcp)),
            tmp=tmp)
        if not storage_env:
            if before is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = before
        yield world


def gcp_profile(path: Path, **gcp: Any) -> Path:
    """A profile's [compute] and [gcp] tables as an operator writes them for this project."""
    table = {"bucket": BUCKET, **gcp}
    lines = ['[compute]', 'type = "gce"', f'project = "{PROJECT}"', 'zone = "us-central1-a"',
             'fallback_zones = ["us-central1-b"]', 'instance = "slm-node"',
             'provisioning = "spot"', "on_demand_fallback = true", "", "[compute.node]",
             'prefect_api_key_secret = "prefect-api-key"', "", "[gcp]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def spec_of(path: Path) -> GcpSpec:
    import tomllib

    return spec_from_profile(path, tomllib.loads(path.read_text()))


@contextmanager
def set_up_project(tmp: Path) -> Iterator[World]:
    """An empty project after `gcp setup` of the profile tmp/p.toml (gcp_profile): its network,
    accounts, grants and bucket, as an operator's first command leaves them."""
    from tasks.gcp.setup import ApplyOptions, apply

    with empty_project(tmp) as world:
        spec = spec_of(gcp_profile(tmp / "p.toml"))
        apply(spec, world.clients(), "setup", state_dir=tmp / "state-setup",
              options=ApplyOptions(values={"prefect-api-key": b"pnu_x"}), say=lambda _: None)
        yield world
