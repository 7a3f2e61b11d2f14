"""Adapters served by name: each bucket's promoted adapter is served under the bucket's name
(`engineering-pointsav`, `apprenticeship-pointsav`), on the base it was trained on and no other.

Two servers load adapters:
- the nightly's own extraction server (llama.cpp, started at phase 1): `local_serving` says
  whether the promoted GGUF applies to the GGUF that server serves (the digest recorded in the
  manifest against the served file's), and under which names to serve it;
- a configured serving endpoint for the trained model (blocks/serving.py ServingEndpoint):
  `publish` tells a vLLM server to load the adapter under the bucket's name (vLLM's runtime LoRA
  API) and checks that the name answers; a llama.cpp endpoint loads adapters only when it
  starts, so for it the check is all there is.

vLLM's runtime LoRA API, as its source has it (vllm/entrypoints/serve/lora/api_router.py and
vllm/entrypoints/openai/models/serving.py, 2025–2026): the routes exist only when the server
runs with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (else 404 {"detail": "Not Found"});
POST /v1/load_lora_adapter {"lora_name", "lora_path"} answers 200 with a text body, 400 when
the name is already loaded, 404 NotFoundError when no adapter is at the path, 500 when the
engine cannot load it; POST /v1/unload_lora_adapter {"lora_name"} answers 404 for a name it
does not have; GET /v1/models lists each adapter with `root` (its path) and `parent` (the
base); a chat completion naming a model it does not serve answers 404 NotFoundError. A
duplicate name is refused, not replaced: replacing is unload, then load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from blocks.serving import ServingEndpoint
from tasks.engine.llama_cpp import default_model_path
from tasks.records import AdapterManifest, PublishResult
from tasks.shared.errors import ServingError
from tasks.training.base_model import gguf_digest
from tasks.training.registry import ArtifactStore

RUNTIME_LORA_OFF = ("the server has no runtime LoRA API (404 on {route}): start vLLM with "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora")


# --- the nightly's own extraction server (llama.cpp) -----------------------------------------

def base_mismatch(m: AdapterManifest, served_gguf: Path) -> str | None:
    """None when adapter `m` was trained on the GGUF the server serves; else why it was not
    (or why that cannot be told). The digest recorded at training is compared with the served
    file's (a manifest without one: the digest of the base GGUF file it names, if still there)."""
    want = m.base.gguf_digest
    if want is None and m.base.gguf and Path(m.base.gguf).is_file():
        want = gguf_digest(Path(m.base.gguf))
    if want is None:
        return (f"adapter {m.name} ({m.bucket}) records no base GGUF (trained on "
                f"{m.base.spec}): it cannot be shown to apply to {served_gguf}")
    have = gguf_digest(served_gguf)
    if want != have:
        return (f"adapter {m.name} ({m.bucket}) was trained on base {m.base.gguf or m.base.spec} "
                f"(GGUF digest {want}), but the server serves {served_gguf} (digest {have})")
    return None


@dataclass(frozen=True)
class LocalServing:
    """What tonight's extraction server loads: the adapter (None: the base model alone), the
    names it is served under besides the endpoint's model name, and why the base is served
    when an adapter is promoted."""

    adapter: Path | None
    names: tuple[str, ...] = ()
    note: str | None = None


def local_serving(store: ArtifactStore, bucket: str, served_gguf: Path) -> LocalServing:
    """The promoted adapter of `bucket` if it applies to `served_gguf`, served under the bucket's
    name; else the base model, with the reason."""
    m = store.promoted(bucket)
    if m is None:
        return LocalServing(None)
    gguf = store.serving(bucket)
    if gguf is None:
        return LocalServing(None, note=f"promoted adapter {m.name} ({bucket}) has no GGUF "
                            "export for llama.cpp — serving the base model")
    why = base_mismatch(m, served_gguf)
    if why:
        return LocalServing(None, note=f"{why} — serving the base model instead (retrain the "
                            f"bucket on this base, or roll back: slm-nightly adapters rollback "
                            f"{bucket})")
    return LocalServing(gguf, (bucket,))


def served_gguf(model_path: str | None) -> Path:
    """The GGUF the local server serves: the compute block's model_path, else the bundled one."""
    return Path(model_path) if model_path else default_model_path()


# --- a configured serving endpoint ------------------------------------------------------------

class _Client:
    def __init__(self, endpoint: ServingEndpoint) -> None:
        self.url = endpoint.base_url
        key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
        # one client for the publish's few requests (each new one builds an SSL context)
        self.http = httpx.Client(headers={"Authorization": f"Bearer {key}"} if key else {},
                                 timeout=endpoint.timeout_seconds)

    def request(self, method: str, route: str, body: dict[str, Any] | None = None
                ) -> httpx.Response:
        try:
            r = self.http.request(method, f"{self.url}{route}", json=body)
        except httpx.HTTPError as e:
            raise ServingError(f"{method} {self.url}{route}: {type(e).__name__}: {e} — is the "
                               "serving endpoint up (base_url in [serving])?") from e
        if r.status_code == 401:
            raise ServingError(f"{method} {self.url}{route}: 401 — the endpoint wants another "
                               "api key (the [serving] block's api_key)")
        return r

    def models(self) -> dict[str, dict[str, Any]]:
        r = self.request("GET", "/v1/models")
        if r.status_code != 200:
            raise ServingError(f"GET {self.url}/v1/models: HTTP {r.status_code}: {_why(r)[1]}")
        # llama-server lists one card per model, its other names under "aliases"
        return {name: m for m in r.json().get("data") or []
                for name in dict.fromkeys([m.get("id", ""), *(m.get("aliases") or [])])}

    def adapters(self) -> list[dict[str, Any]]:
        """llama-server's GET /lora-adapters ([] when the server has no such route)."""
        r = self.request("GET", "/lora-adapters")
        return list(r.json()) if r.status_code == 200 else []

    def lora(self, action: str, body: dict[str, Any]) -> None:
        route = f"/v1/{action}_lora_adapter"
        r = self.request("POST", route, body)
        if r.status_code == 200:
            return
        kind, message = _why(r)
        if r.status_code == 404 and kind != "NotFoundError":  # FastAPI's answer: no such route
            raise ServingError(RUNTIME_LORA_OFF.format(route=route))
        hint = ""
        if action == "load" and r.status_code == 404:
            hint = (" — the server cannot read the adapter at that path: set [serving] "
                    "adapter_root to the adapters/ folder as the server sees it")
        raise ServingError(f"POST {self.url}{route} {body}: HTTP {r.status_code} {kind}: "
                           f"{message}{hint}")

    def answer(self, name: str, prompt: str, lora: list[dict[str, Any]] | None = None) -> str:
        r = self.request("POST", "/v1/chat/completions", {
            "model": name, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8, "temperature": 0, **({"lora": lora} if lora is not None else {})})
        if r.status_code != 200:
            kind, message = _why(r)
            raise ServingError(f"a chat completion with model={name!r} failed: HTTP "
                               f"{r.status_code} {kind}: {message}")
        choices = r.json().get("choices") or []
        if not choices:
            raise ServingError(f"a chat completion with model={name!r} answered no choices")
        msg = choices[0].get("message") or {}
        return str(msg.get("content") or msg.get("reasoning_content") or "")


def _why(r: httpx.Response) -> tuple[str, str]:
    """(error type, message) of an error answer: vLLM's {"error": {"type", "message"}}, its
    older flat {"type", "message"}, or FastAPI's {"detail": …}."""
    try:
        body = r.json()
    except ValueError:
        return "", r.text[:300]
    if not isinstance(body, dict):
        return "", str(body)[:300]
    err = body["error"] if isinstance(body.get("error"), dict) else body
    return str(err.get("type") or ""), str(err.get("message") or body.get("detail") or "")[:500]


def lora_path(endpoint: ServingEndpoint, store: ArtifactStore, m: AdapterManifest) -> str:
    """The adapter as the server sees it: vLLM loads the PEFT folder, llama.cpp the GGUF."""
    root = (endpoint.adapter_root or str(store.root / "adapters")).rstrip("/")
    return f"{root}/{m.name}/" + ("peft" if endpoint.kind == "vllm" else "adapter.gguf")


def _base_differs(endpoint: ServingEndpoint, m: AdapterManifest) -> str | None:
    names = {m.base.spec, m.base.gguf, m.base.gguf_digest} - {None}
    if endpoint.base_model in names:
        return None
    return (f"adapter {m.name} was trained on base {m.base.spec}"
            f"{f' ({m.base.gguf})' if m.base.gguf else ''}, but the endpoint serves "
            f"{endpoint.base_model} — not loaded (train on the served base, or fix [serving] "
            "base_model)")


def publish(endpoint: ServingEndpoint, store: ArtifactStore, bucket: str) -> PublishResult:
    """Serve `bucket`'s promoted adapter under the name `bucket` on the endpoint and check the
    name answers. Never raises: a failure is the result's message (the promotion stands)."""
    res = PublishResult(name=bucket, state="failed", endpoint=endpoint.base_url)
    client = _Client(endpoint)
    try:
        m = store.promoted(bucket)
        models = client.models()
        if m is None:
            if bucket in models and endpoint.kind == "vllm":  # rolled back to the base model
                client.lora("unload", {"lora_name": bucket})
                res.state, res.message = "withdrawn", (f"nothing is promoted for {bucket}: "
                                                       "its name was unloaded")
            else:
                res.state, res.message = "skipped", f"nothing is promoted for {bucket}"
            return res
        res.adapter, res.base = m.name, m.base.spec
        why = _base_differs(endpoint, m)
        if why:
            res.message = why
            return res
        # vLLM loads the PEFT folder, llama.cpp the GGUF: the manifest lists what the run wrote
        # (the server reads its own copy: with GCS as the store's truth this disk may not have it)
        kind, file = ("peft", "peft/adapter_config.json") if endpoint.kind == "vllm" \
            else ("gguf", "adapter.gguf")
        if not ((m.files or {}).get(kind) or (store.adapter_dir(m.name) / file).is_file()):
            res.message = (f"adapter {m.name} has no {kind} export to serve on {endpoint.kind} "
                           f"(its manifest's files: {m.files})")
            return res
        res.lora_path = path = lora_path(endpoint, store, m)
        if endpoint.kind == "vllm":
            card = models.get(bucket)
            if card is None or card.get("root") != path:
                if card is not None:  # vLLM refuses a name it has: replace = unload, load
                    client.lora("unload", {"lora_name": bucket})
                client.lora("load", {"lora_name": bucket, "lora_path": path})
                res.loaded = True
                card = client.models().get(bucket)
                if card is None or card.get("root") != path:
                    raise ServingError(f"the endpoint accepted the load but lists {bucket!r} "
                                       f"as {card}")
        lora = None
        if endpoint.kind != "vllm":
            restart = (f"llama.cpp loads adapters when it starts — restart llama-server with "
                       f"--alias including {bucket!r} and --lora {path}")
            # llama-server answers a name it does not serve with its model (HTTP 200): ask
            # only once the name is listed, or the check would pass on the base.
            if bucket not in models:
                raise ServingError(f"the endpoint does not list {bucket!r} (it lists "
                                   f"{sorted(models)}): {restart}")
            ids = [a["id"] for a in client.adapters() if a.get("path") == path]
            if not ids:
                raise ServingError(f"the endpoint serves {bucket!r} without adapter {path} "
                                   f"(GET /lora-adapters does not list it): {restart}")
            # named explicitly: a request without `lora` can reuse a prompt cache computed
            # under another adapter setting (upstream #26207)
            lora = [{"id": ids[0], "scale": 1.0}]
        answer = client.answer(bucket, endpoint.check_prompt, lora)
        res.answered, res.state = True, "served"
        res.message = f"answers by name {bucket!r} ({answer.strip()[:60]!r})"
    except ServingError as e:
        res.message = str(e)
    except Exception as e:  # noqa: BLE001 - reported; the promotion is not undone
        res.message = f"{type(e).__name__}: {e}"
    finally:
        client.http.close()
    return res


def publish_promoted(endpoint: ServingEndpoint, store: ArtifactStore
                     ) -> dict[str, PublishResult]:
    """Every configured bucket's promoted adapter onto the endpoint (a night with no new
    promotion still reloads what a restarted server lost)."""
    return {bucket: publish(endpoint, store, bucket) for bucket in endpoint.buckets}
