"""A fake vLLM OpenAI-compatible server with runtime LoRA updating, on loopback.

It follows vLLM's source (main branch, 2025–2026: vllm/entrypoints/serve/lora/api_router.py,
vllm/entrypoints/openai/models/serving.py, vllm/entrypoints/openai/engine/serving.py
`_check_model`, vllm/exceptions.py LoRAAdapterNotFoundError, vllm/entrypoints/serve/utils/
error_response.py), answer for answer:
- the LoRA routes exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (`runtime_lora`): without
  it FastAPI answers 404 {"detail": "Not Found"};
- POST /v1/load_lora_adapter {"lora_name", "lora_path"}: 200 with the text "Success: LoRA
  adapter '<name>' added successfully."; 400 InvalidUserInput when a field is empty ("Both
  'lora_name' and 'lora_path' must be provided.") or the name is loaded already ("The lora
  adapter '<name>' has already been loaded. If you want to load the adapter in place, set
  'load_inplace' to True."); 404 NotFoundError "Loading lora <name> failed: No adapter found
  for <path>" when the path holds no adapter (the fake: no adapter_config.json there);
- POST /v1/unload_lora_adapter {"lora_name"}: 200 "Success: LoRA adapter '<name>' removed
  successfully."; 404 NotFoundError "The lora adapter '<name>' cannot be found.";
- GET /v1/models: the base model card (root = its path) and one card per adapter with
  root = lora_path and parent = the base's name;
- POST /v1/chat/completions: 404 NotFoundError "The model `<name>` does not exist." (param
  "model") for a name neither the base nor a loaded adapter; else an answer naming the model
  that answered (the fake's stand-in for the adapter's effect);
- with an api key (vLLM --api-key), 401 {"error": "Unauthorized"} without the bearer token.
Errors are {"error": {"message", "type", "param", "code"}} with code = the HTTP status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fakes.loopback import JsonHandler, LoopbackServer, Served


class FakeVllm(Served):
    def __init__(self, base: str = "olmo-3-7b", root: str = "/opt/models/olmo-3-7b",
                 runtime_lora: bool = True, api_key: str | None = None) -> None:
        self.base, self.root, self.runtime_lora, self.api_key = base, root, runtime_lora, api_key
        self.loras: dict[str, str] = {}  # name → path, in load order
        self.calls: list[tuple[str, str, dict[str, Any]]] = []  # (method, path, body)
        fake = self

        class Handler(JsonHandler):
            def _send(self, status: int, body: Any) -> None:
                if isinstance(body, str):
                    self.send_body(status, body.encode(), "text/plain")
                else:
                    self.send_json(status, body)

            def _authorized(self) -> bool:
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._send(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.calls.append(("GET", self.path, {}))
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": fake.cards()})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.read_body() or b"{}")
                fake.calls.append(("POST", self.path, body))
                if not self._authorized():
                    return
                routes = {"/v1/chat/completions": fake.chat}
                if fake.runtime_lora:
                    routes.update({"/v1/load_lora_adapter": fake.load,
                                   "/v1/unload_lora_adapter": fake.unload})
                if self.path not in routes:
                    self._send(404, {"detail": "Not Found"})
                    return
                self._send(*routes[self.path](body))

        # a short poll: shutdown() waits for it (the default 0.5 s, per test)
        self.http = LoopbackServer(Handler, poll=0.02)

    # --- vLLM's behaviour ------------------------------------------------------------------
    @staticmethod
    def error(status: int, kind: str, message: str, param: str | None = None
              ) -> tuple[int, dict[str, Any]]:
        return status, {"error": {"message": message, "type": kind, "param": param,
                                  "code": status}}

    def cards(self) -> list[dict[str, Any]]:
        base = {"id": self.base, "object": "model", "owned_by": "vllm", "root": self.root,
                "parent": None, "max_model_len": 8192}
        return [base, *({"id": n, "object": "model", "owned_by": "vllm", "root": p,
                         "parent": self.base} for n, p in self.loras.items())]

    def load(self, body: dict[str, Any]) -> tuple[int, Any]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return self.error(400, "InvalidUserInput",
                              "Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.loras:
            return self.error(400, "InvalidUserInput",
                              f"The lora adapter '{name}' has already been loaded. If you want "
                              "to load the adapter in place, set 'load_inplace' to True.")
        if not (Path(path) / "adapter_config.json").is_file():
            return self.error(404, "NotFoundError",
                              f"Loading lora {name} failed: No adapter found for {path}")
        self.loras[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("lora_name")
        if not name:
            return self.error(400, "InvalidUserInput",
                              "'lora_name' needs to be provided to unload a LoRA adapter.")
        if name not in self.loras:
            return self.error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        del self.loras[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def chat(self, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        if model != self.base and model not in self.loras:
            return self.error(404, "NotFoundError", f"The model `{model}` does not exist.",
                              "model")
        via = f"{self.base} + {self.loras[model]}" if model in self.loras else self.base
        return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant",
                                              "content": f"ready ({via})"}}]}
