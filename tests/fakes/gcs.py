"""gcp-storage-emulator on loopback, plus a fake OAuth token endpoint, so prefect-gcp's
GcsBucket (google-cloud-storage underneath) runs unmodified against it. The emulator runs with
GCS's generation preconditions added (tests/support/gcs_preconditions.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tasks.shared.processes import free_port, port_open
from tests.fakes.loopback import JsonHandler, LoopbackServer
from tests.support.paths import ROOT


class _Token(JsonHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.read_body()
        self.send_json(200, {"access_token": "fake-token", "expires_in": 3600,
                             "token_type": "Bearer"})


def service_account(token_uri: str,
                    email: str = "sync@test-project.iam.gserviceaccount.com") -> dict:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "test-project", "private_key_id": "k1",
            "private_key": pem, "client_email": email,
            "client_id": "1", "token_uri": token_uri}


class GcsEmulator:
    def __init__(self, data: Path) -> None:
        self.port = free_port()
        self.token = LoopbackServer(_Token)
        self.data = data

    def __enter__(self) -> GcsEmulator:
        self.token.__enter__()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "support" / "gcs_preconditions.py"), "start",
             "--host", "127.0.0.1",
             "--port", str(self.port), "--default-bucket", "slm-corpus"],
            cwd=self.data, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if port_open(self.port):
                break
            time.sleep(0.1)
        self._old = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = self._old
        self.proc.terminate()
        self.proc.wait(10)
        self.token.__exit__()

    def token_uri(self) -> str:
        return f"{self.token.url}/token"

    def adc(self) -> dict[str, str]:
        """Environment for application-default credentials (GOOGLE_APPLICATION_CREDENTIALS: a
        service-account file whose tokens come from the fake endpoint) and the emulator."""
        path = self.data / "adc.json"
        path.write_text(json.dumps(service_account(self.token_uri())))
        return {"GOOGLE_APPLICATION_CREDENTIALS": str(path),
                "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{self.port}"}

    def bucket(self, name: str = "slm-corpus", folder: str = ""):  # type: ignore[no-untyped-def]
        from prefect_gcp import GcpCredentials, GcsBucket

        # a key of its own account: not the orchestrator's (tests/support/gce.py SA), whose key in a
        # bucket block preflight refuses (the node would act as the orchestrator)
        info = service_account(self.token_uri(), "gcs-key@test-project.iam.gserviceaccount.com")
        creds = GcpCredentials(service_account_info=info, project="test-project")
        return GcsBucket(bucket=name, gcp_credentials=creds, bucket_folder=folder)
