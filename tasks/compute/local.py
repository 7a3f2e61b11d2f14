"""The local node (the node protocol of tasks/compute/protocol.py on a LocalCompute block):
this machine is the node and llama.cpp's own server (llama-server) on 127.0.0.1 stands in for
the GPU node's engine, started and stopped by PID. Nothing to boot, nothing to pay."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Self

from blocks.compute import LocalCompute
from blocks.inference import InferenceEndpoint
from tasks.compute import inference_server
from tasks.compute.threads import auto_threads
from tasks.engine.llama_cpp import default_model_path
from tasks.records import NodeUsage
from tasks.shared.processes import ManagedServer


class LocalNode:
    """This machine as the node."""

    remote_training = False  # training runs in this process
    loads_adapters = True  # llama.cpp serves the promoted GGUF LoRA adapter

    def __init__(self, block: LocalCompute) -> None:
        self.block = block
        self._threads: int | None = None

    def __repr__(self) -> str:
        return f"LocalNode({self.block!r})"

    @property
    def base_model(self) -> str | None:
        """The GGUF the server serves when the profile names one (else the default model)."""
        return self.block.model_path

    @property
    def cpu_threads(self) -> int:
        """The block's n_threads, else auto_threads(), chosen once for this node (the server
        and verification use the same count)."""
        if self._threads is None:
            self._threads = self.block.n_threads or auto_threads()
        return self._threads

    boot_timeout_seconds = None  # nothing boots
    stop_timeout_seconds = None  # nothing stops this machine by itself

    @property
    def watch_seconds(self) -> float:
        return 2.0  # the node is this machine: checking it costs nothing

    @property
    def _state_dir(self) -> Path:
        return Path(self.block.state_dir)

    def start(self, max_run_seconds: float | None = None,
              timeout_seconds: float | None = None) -> str:
        """Boot the node (nothing to do locally; nothing stops this machine, so
        `max_run_seconds` is ignored, and nothing boots, so `timeout_seconds` is too). Returns
        a description for the summary."""
        self._state_dir.mkdir(parents=True, exist_ok=True)
        return "local machine"

    def prepare(self, endpoint: InferenceEndpoint) -> list[str]:
        """Nothing to install: the local server is started with the profile's settings."""
        return []

    def start_inference(self, endpoint: InferenceEndpoint, adapter: Path | None = None,
                        names: tuple[str, ...] = ()) -> str:
        """Bring the inference server up (with the GGUF LoRA `adapter` when given, checked to
        load, served as the endpoint's model and under each of `names`) and wait until it is
        ready; return its base URL."""
        if endpoint.base_url:  # an external server: only wait for it
            key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
            inference_server.wait_ready(endpoint.base_url, endpoint.readiness_timeout_seconds, key)
            return endpoint.base_url
        model = Path(self.block.model_path) if self.block.model_path \
            else default_model_path()
        # one slot per request the client may have in flight, each of the full context
        return inference_server.start_llama_server(
            self._state_dir, inference_server.Served(model, endpoint.model, adapter, names),
            endpoint.context_tokens, self.cpu_threads, endpoint.readiness_timeout_seconds,
            slots=endpoint.max_concurrent_requests,
        )

    def stop_inference(self) -> bool:
        """Stop the server we started (by PID) and verify it is gone; frees the CPU/GPU."""
        return inference_server.stop_llama_server(self._state_dir)

    def inference_running(self) -> bool:
        return inference_server.llama_server_running(self._state_dir)

    def request_stop(self) -> list[str]:
        """The fast first step of teardown: locally, stop the inference server."""
        self.stop_inference()
        return ["local"]

    def stop(self) -> list[str]:
        """Put the node to sleep: locally, make sure no server is left running. Returns
        ["local"] when a server was stopped."""
        return ["local"] if self.stop_inference() else []

    def check_running(self) -> None:
        """This machine cannot be preempted: nothing to check."""

    def running(self) -> dict[str, str]:
        """{"local": …} while a server this project started is up (what the reaper stops)."""
        return {"local": "inference server running"} if self.inference_running() else {}

    def signal_stops(self) -> list[tuple[str, ManagedServer, Callable[[], bool]]]:
        """The llama.cpp server, stateless and busy with a request it would finish before a
        graceful exit: stopped with a 1 s grace."""
        server = ManagedServer(inference_server.SERVER_NAME, self._state_dir)
        return [("the inference server (llama.cpp)", server, lambda: server.stop(grace=1.0))]

    @property
    def server_exit(self) -> Callable[[], str | None] | None:
        """The server is this run's own: when it dies, phase 1 says how."""
        return partial(inference_server.server_exit, self._state_dir)

    def engine_here(self, state_dir: Path) -> Self | None:
        """This machine again, its server's state in `state_dir` (the profile's model, context,
        slots and threads)."""
        return type(self)(self.block.model_copy(update={"state_dir": str(state_dir)}))

    def usage(self, since: float | None = None) -> NodeUsage:
        """This machine costs nothing per run."""
        return NodeUsage(running_seconds=0.0, gpu_hours=0.0, estimated_usd=0.0, zones={},
                         note="local machine: no cost")
