"""The Google client of each API `gcp` commands call, made once, on one set of credentials.

REST everywhere the library has it (compute, Resource Manager, Service Usage, Cloud Quotas,
Secret Manager, Cloud Storage's JSON API). IAM admin (service accounts) is gRPC only:
google-cloud-iam 2.27 ships no REST transport for iam_admin_v1.

Endpoints: Google's, unless $SLM_GCP_API_ENDPOINTS (JSON, api name → URL: a private endpoint,
or a local fake in tests) names one. An `http://` endpoint for IAM is a plaintext local gRPC
channel that still carries the credentials (grpc.local_channel_credentials); anything else
gets TLS as usual.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from typing import Any

import google.auth
import grpc
from google.api_core.client_options import ClientOptions
from google.auth.exceptions import DefaultCredentialsError
from google.auth.transport.grpc import AuthMetadataPlugin
from google.auth.transport.requests import Request
from google.cloud import cloudquotas_v1, iam_admin_v1, resourcemanager_v3, secretmanager_v1, service_usage_v1
from google.cloud.iam_admin_v1.services.iam.transports import IAMGrpcTransport
from google.cloud.storage import Client

from tasks.shared.errors import ConfigError

ENDPOINTS_ENV = "SLM_GCP_API_ENDPOINTS"
API_NAMES = ("compute", "storage", "iam", "resourcemanager", "serviceusage", "secretmanager",
             "cloudquotas")
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def endpoints_from_env() -> dict[str, str]:
    raw = os.environ.get(ENDPOINTS_ENV, "").strip()
    if not raw:
        return {}
    try:
        found = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"${ENDPOINTS_ENV} is not JSON ({e}) — set it to "
                          '{"compute": "https://…", …} or unset it') from None
    unknown = sorted(set(found) - set(API_NAMES)) if isinstance(found, dict) else ["(not a map)"]
    if unknown:
        raise ConfigError(f"${ENDPOINTS_ENV}: unknown API name(s) {unknown} — use "
                          f"{list(API_NAMES)}")
    return {k: str(v).rstrip("/") for k, v in found.items()}


def default_credentials() -> Any:
    try:
        creds, _ = google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError as e:
        raise ConfigError("gcp: no Google credentials — run `gcloud auth application-default "
                          "login` as a project owner (setup makes accounts and grants)") from e
    return creds


class Clients:
    """Each API's client, built on first use."""

    def __init__(self, credentials: Any = None, endpoints: dict[str, str] | None = None,
                 project: str | None = None) -> None:
        self._credentials = credentials
        self.endpoints = endpoints if endpoints is not None else endpoints_from_env()
        self.project = project

    @cached_property
    def credentials(self) -> Any:
        return self._credentials if self._credentials is not None else default_credentials()

    def _options(self, api: str) -> Any:
        url = self.endpoints.get(api)
        return ClientOptions(api_endpoint=url) if url else None

    def _rest(self, cls: Any, api: str) -> Any:
        return cls(transport="rest", credentials=self.credentials,
                   client_options=self._options(api))

    def compute(self, name: str) -> Any:
        """compute_v1.<name> (NetworksClient, FirewallsClient, …), REST."""
        from google.cloud import compute_v1

        return self._rest(getattr(compute_v1, name), "compute")

    @cached_property
    def services(self) -> Any:
        return self._rest(service_usage_v1.ServiceUsageClient, "serviceusage")

    @cached_property
    def quotas(self) -> Any:
        return self._rest(cloudquotas_v1.CloudQuotasClient, "cloudquotas")

    @cached_property
    def projects(self) -> Any:
        return self._rest(resourcemanager_v3.ProjectsClient, "resourcemanager")

    @cached_property
    def secrets(self) -> Any:
        return self._rest(secretmanager_v1.SecretManagerServiceClient, "secretmanager")

    @cached_property
    def iam(self) -> Any:
        url = self.endpoints.get("iam")
        if url and url.startswith("http://"):
            call = grpc.metadata_call_credentials(AuthMetadataPlugin(self.credentials,
                                                                     Request()))
            channel = grpc.secure_channel(url.removeprefix("http://"),
                                          grpc.composite_channel_credentials(
                                              grpc.local_channel_credentials(), call))
            return iam_admin_v1.IAMClient(transport=IAMGrpcTransport(channel=channel))
        return iam_admin_v1.IAMClient(credentials=self.credentials,
                                      client_options=self._options("iam"))

    @cached_property
    def storage(self) -> Any:
        return Client(project=self.project, credentials=self.credentials,
                              client_options=self._options("storage"))
