"""The node's host RAM: llama-server's context checkpoints and prompt cache beside the engine,
the Prefect worker and the OS (tasks/compute/host_memory.py), the flags that set them on the
engine's command line, and the preflight that refuses a setting that does not fit. Every
number is worked out by hand here from OLMo 3 32B's shape (64 layers, 48 of them sliding at
4096, 8 KV heads of 128), not by the code under test."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from blocks.inference import InferenceEndpoint
from blocks.node_serve import NodeServeSettings
from tasks.compute.gce.startup import llama_cpp_launch_args
from tasks.compute.host_memory import (
    Host,
    checkpoint_bytes,
    host_fit,
    most_checkpoints,
    row_bytes,
    slot_state_bytes,
)
from tasks.compute.inference_server import Served, ServerSettings, llama_server_args
from tasks.compute.kv_budget import ModelShape
from tasks.preflight.node import host_memory_check

GIB = 2**30
OLMO3_32B = ModelShape(layers=64, kv_heads=8, head_dim=128, sliding_layers=48,
                       sliding_window=4096)
# One SWA cell of a checkpoint: 12 bytes of metadata (pos, n_seq_id, seq_id), then per sliding
# layer a K and a V row of 8 x 128 elements — q8_0: 1024 / 32 blocks of 34 bytes = 1088.
Q8_CELL = 12 + 48 * 2 * 1088  # 104,460
F16_CELL = 12 + 48 * 2 * 2048  # 196,620


def test_a_checkpoint_is_the_sliding_window_of_one_slot() -> None:
    assert Q8_CELL == 104_460 and F16_CELL == 196_620
    # a full window: 4096 cells
    assert checkpoint_bytes(8192, OLMO3_32B, cache_type="q8_0") == 4096 * 104_460 \
        == 427_868_160  # 0.398 GiB
    assert checkpoint_bytes(8192, OLMO3_32B, cache_type="f16") == 805_355_520  # 0.750 GiB
    # a context shorter than the window: its own tokens only
    assert checkpoint_bytes(2048, OLMO3_32B, cache_type="q8_0") == 2048 * 104_460
    # no sliding layers: llama-server makes no checkpoints
    assert checkpoint_bytes(8192, ModelShape(layers=64, kv_heads=8, head_dim=128,
                                             sliding_layers=0, sliding_window=0),
                            cache_type="q8_0") == 0
    # an idle-slot save: the 16 full layers over 8192 tokens plus the window —
    # 8192 x (12 + 16 x 2 x 1088) + 427,868,160 = 285,310,976 + 427,868,160 (~0.7 GB)
    assert slot_state_bytes(8192, OLMO3_32B, cache_type="q8_0") == 713_179_136


def test_the_production_settings_fit_the_16_gib_node() -> None:
    # 8 slots x 8192 at q8_0, 3 checkpoints each, no prompt cache: 24 x 427,868,160 B =
    # 9.5636 GiB, + 1.5 (llama-server) + 1.5 (worker and flow run) + 1.0 (OS) = 13.56 GiB
    fit = host_fit(8, 8192, OLMO3_32B, "q8_0", Host(gib=16.0, ctx_checkpoints=3,
                                                     cache_ram_mib=0, cache_idle_slots=False))
    assert fit.fits and fit.idle_save_bytes == 0
    assert round(fit.checkpoints_gib, 4) == round(24 * 427_868_160 / GIB, 4) == 9.5636
    assert fit.text() == (
        "8 slots x 3 context checkpoints of 0.40 GiB = 9.56 GiB + prompt cache 0.00 GiB "
        "(--cache-ram 0, no idle-slot saves) + llama-server 1.5 GiB + Prefect worker and flow "
        "run 1.5 GiB + OS 1.0 GiB = 13.56 GiB of the node's 16.0 GiB of RAM (estimate)")
    # llama-server's own defaults (32 checkpoints, 8 GiB of cache, idle saves): 8 x 32 x
    # 0.3985 = 102.01 GiB of checkpoints alone
    default = host_fit(8, 8192, OLMO3_32B, "q8_0", Host(gib=16.0, ctx_checkpoints=32,
                                                         cache_ram_mib=8192,
                                                         cache_idle_slots=True))
    assert not default.fits and round(default.needed_gib, 2) == 102.01 + 8 + 4
    assert default.idle_save_bytes == 713_179_136


def test_preflight_refuses_a_node_whose_ram_the_caches_overrun() -> None:
    ok = host_memory_check(NodeServeSettings(kv_cache_type="q8_0"), 8, 8192)
    assert ok.ok and ok.name == "engine host memory" and "13.56 GiB of the node's 16.0" in ok.detail
    # f16: 8 x 3 x 805,355,520 B = 18.00 GiB + 4.0 = 22.00 GiB > 16. What fits: 12 GiB left
    # for checkpoints — 2 per slot are 8 x 2 x 0.7500 = 12.0009 GiB (no), 1 is 6.0 (yes); or
    # 3 per slot in 5 slots (5 x 3 x 0.75 = 11.25), not 6 (13.50)
    bad = host_memory_check(NodeServeSettings(kv_cache_type="f16"), 8, 8192)
    assert not bad.ok
    assert bad.detail.startswith("8 slots x 3 context checkpoints of 0.75 GiB = 18.00 GiB")
    assert bad.detail.endswith("= 22.00 GiB of the node's 16.0 GiB of RAM (estimate): does "
                               "not fit")
    assert bad.fix == (
        "set [compute.node] ctx_checkpoints to 1 or less (the most per slot that fit; under 3 "
        "none survives to the next chunk); or set [inference] max_concurrent_requests to 5 or "
        "less (the most slots that fit)")
    # a prompt cache on top is named too: 2 GiB more
    cache = host_memory_check(NodeServeSettings(kv_cache_type="q8_0", cache_ram_mib=4096,
                                                host_memory_gib=15.0), 8, 8192)
    assert not cache.ok and "prompt cache 4.00 GiB (--cache-ram 4096, no idle-slot saves)" \
        in cache.detail and "= 17.56 GiB of the node's 15.0 GiB" in cache.detail
    assert "cache_ram_mib = 0" in cache.fix and "ctx_checkpoints to 2 or less" in cache.fix


def test_the_engine_gets_the_host_cache_flags() -> None:
    argv = llama_server_args("/b/llama-server", Served("/m.gguf", "m"), ServerSettings(
        slots=8, context_tokens=8192, threads=2, cache_ram_mib=0, ctx_checkpoints=3,
        cache_idle_slots=False), host="127.0.0.1", port=1)
    assert argv[argv.index("--cache-ram"):] == ["--cache-ram", "0", "--ctx-checkpoints", "3",
                                                "--no-cache-idle-slots"]
    on = llama_server_args("/b/llama-server", Served("/m.gguf", "m"), ServerSettings(
        slots=1, context_tokens=512, threads=1, cache_ram_mib=512, ctx_checkpoints=0,
        cache_idle_slots=True), host="127.0.0.1", port=1)
    assert on[on.index("--cache-ram"):] == ["--cache-ram", "512", "--ctx-checkpoints", "0",
                                            "--cache-idle-slots"]
    # unset: no flag (llama-server's own defaults)
    plain = llama_server_args("/b/llama-server", Served("/m.gguf", "m"),
                              ServerSettings(slots=1, context_tokens=512, threads=1),
                              host="127.0.0.1", port=1)
    assert not {"--cache-ram", "--ctx-checkpoints", "--cache-idle-slots",
                "--no-cache-idle-slots"} & set(plain)
    node = llama_cpp_launch_args(InferenceEndpoint(model="m", dialect="llama.cpp"),
                                 settings=NodeServeSettings(ctx_checkpoints=2))
    i = node.index("--cache-ram")
    assert node[i:i + 5] == ["--cache-ram", "0", "--ctx-checkpoints", "2",
                             "--no-cache-idle-slots"]


@pytest.mark.parametrize("flag", ["-ctxcp", "--ctx-checkpoints", "--swa-checkpoints=4", "-cram",
                                  "--cache-ram", "--cache-idle-slots", "--no-cache-idle-slots"])
def test_extra_args_cannot_resize_the_host_caches(flag: str) -> None:
    with pytest.raises(ValidationError, match="ctx_checkpoints, cache_ram_mib and "
                                              "cache_idle_slots"):
        NodeServeSettings(extra_args=[flag, "8"])


def test_an_unknown_cache_type_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError) as e:
        row_bytes(8, 128, "q5_1")
    assert str(e.value) == "KV cache type 'q5_1': use one of f16, bf16, q8_0, q4_0"
    # 8 x 128 elements: f16 2 bytes each, q8_0 1024 / 32 blocks of 34 bytes
    assert row_bytes(8, 128, "f16") == 2048 and row_bytes(8, 128, "q8_0") == 1088


def test_a_window_without_sliding_layers_makes_no_checkpoints() -> None:
    # sliding_window set but no layer slides: nothing for llama-server to copy (were the cells
    # counted, 4096 cells x 12 bytes of metadata would show up)
    shape = ModelShape(layers=64, kv_heads=8, head_dim=128, sliding_layers=0, sliding_window=4096)
    assert checkpoint_bytes(8192, shape, cache_type="q8_0") == 0


def test_sliding_layers_without_a_window_save_every_layer_over_the_whole_context() -> None:
    # no window: all 64 layers keep the context, 1024 x (12 + 64 x 2 x 1088) = 142,618,624 B
    # (not 16 full layers' 1024 x (12 + 16 x 2 x 1088) = 35,663,872), and no checkpoint on top
    shape = ModelShape(layers=64, kv_heads=8, head_dim=128, sliding_layers=48, sliding_window=0)
    assert slot_state_bytes(1024, shape, cache_type="q8_0") == 142_618_624


def test_the_node_settings_make_the_host() -> None:
    settings = NodeServeSettings(host_memory_gib=32.0, ctx_checkpoints=4, cache_ram_mib=2048,
                                 cache_idle_slots=True)
    assert Host.of_node(settings) == Host(gib=32.0, ctx_checkpoints=4, cache_ram_mib=2048,
                                          cache_idle_slots=True)
    assert Host.of_node(NodeServeSettings()).cache_idle_slots is False


def test_idle_slot_saves_are_named_inside_the_prompt_cache() -> None:
    # llama-server's defaults: 8 x 32 x 0.39848 GiB = 102.01 GiB of checkpoints + 8 GiB of
    # prompt cache + 4.0 = 114.01 GiB; one idle save 713,179,136 B = 0.66 GiB
    fit = host_fit(8, 8192, OLMO3_32B, "q8_0", Host(gib=16.0, ctx_checkpoints=32,
                                                     cache_ram_mib=8192, cache_idle_slots=True))
    assert (fit.slots, fit.context_tokens, fit.ctx_checkpoints) == (8, 8192, 32)
    assert fit.text() == (
        "8 slots x 32 context checkpoints of 0.40 GiB = 102.01 GiB + prompt cache 8.00 GiB "
        "(--cache-ram 8192, idle-slot saves of 0.66 GiB each and their checkpoints inside it) "
        "+ llama-server 1.5 GiB + Prefect worker and flow run 1.5 GiB + OS 1.0 GiB = 114.01 GiB "
        "of the node's 16.0 GiB of RAM (estimate)")
    # idle saves asked for without a prompt cache: llama-server disables them
    off = host_fit(8, 8192, OLMO3_32B, "q8_0", Host(gib=16.0, ctx_checkpoints=3,
                                                     cache_ram_mib=0, cache_idle_slots=True))
    assert off.idle_save_bytes == 0 and ", no idle-slot saves)" in off.text()


def test_the_most_checkpoints_per_slot_that_fit() -> None:
    # 16 GiB - 4.0 = 12 GiB for 8 slots' checkpoints of 0.39848 GiB: 3 each (9.56), not 4 (12.75)
    host = Host(gib=16.0, ctx_checkpoints=3, cache_ram_mib=0, cache_idle_slots=False)
    assert most_checkpoints(8, 8192, OLMO3_32B, "q8_0", host) == 3
    # not even none fits: the engine, worker and OS (4.0 GiB) overrun a 3 GiB node alone
    small = Host(gib=3.0, ctx_checkpoints=3, cache_ram_mib=0, cache_idle_slots=False)
    assert most_checkpoints(8, 8192, OLMO3_32B, "q8_0", small) == -1
    # a model without sliding layers has checkpoints of 0 bytes: the count stops at 64
    dense = ModelShape(layers=64, kv_heads=8, head_dim=128)
    assert most_checkpoints(8, 8192, dense, "q8_0", host) == 64
