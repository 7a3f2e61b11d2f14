"""A fake of Secret Manager's REST API, the one call preflight makes: GET
v1/projects/{project}/secrets/{secret}/versions/latest (projects.secrets.versions.get,
https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets.versions/get):
the version's metadata, never its payload.

Modelled: a request without `Authorization: Bearer …` is 401 UNAUTHENTICATED; a caller without
`secretmanager.versions.get` (roles/secretmanager.viewer or more) is 403 PERMISSION_DENIED, with
Google's "(or it may not exist)" wording — Secret Manager does not say whether the secret
exists to a caller who may not see it; an unknown secret, or one with no version, is 404
NOT_FOUND "Secret [projects/…/secrets/NAME] not found or has no versions." (the text gcloud
prints, tests/fakes/node_runtime.py); `latest` resolves to the newest version, whose state is ENABLED,
DISABLED or DESTROYED. The caller's identity is not modelled: `viewer` says whether the
orchestrator holds the role on every secret."""

from __future__ import annotations

import re
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

PATH = re.compile(r"^/v1/projects/([^/]+)/secrets/([^/]+)/versions/latest$")


class FakeSecretManager(Served):
    def __init__(self, project: str = "test-project") -> None:
        self.project = project
        self.secrets: dict[str, list[str]] = {}  # name → the states of its versions, oldest first
        self.viewer = True
        self.requests: list[str] = []
        self.http = LoopbackServer(self._handler())

    def add(self, name: str, *states: str) -> None:
        self.secrets[name] = list(states or ("ENABLED",))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(JsonHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                self.send_json(code, body)

            def _error(self, code: int, status: str, message: str) -> None:
                self._answer(code, {"error": {"code": code, "message": message,
                                              "status": status}})

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(self.path)
                m = PATH.match(self.path)
                if not m:
                    return self._error(404, "NOT_FOUND", f"no route {self.path}")
                if not self.headers.get("Authorization", "").startswith("Bearer "):
                    return self._error(401, "UNAUTHENTICATED", "Request is missing required "
                                       "authentication credential.")
                project, name = m.groups()
                resource = f"projects/{project}/secrets/{name}/versions/latest"
                if not fake.viewer:
                    return self._error(403, "PERMISSION_DENIED", "Permission "
                                       f"'secretmanager.versions.get' denied for resource "
                                       f"'{resource}' (or it may not exist).")
                states = fake.secrets.get(name) if project == fake.project else None
                if not states:
                    return self._error(404, "NOT_FOUND", f"Secret [projects/{project}/secrets/"
                                       f"{name}] not found or has no versions.")
                return self._answer(200, {
                    "name": f"projects/{project}/secrets/{name}/versions/{len(states)}",
                    "createTime": "2026-12-01T00:00:00Z", "state": states[-1]})

        return Handler
