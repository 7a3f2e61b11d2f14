"""The slot estimate against figures computed by hand from OLMo 3 32B's model card (64 layers,
8 KV heads of 128, 48 sliding-window layers at 4096) and ggml's type sizes, and the preflight
check built on it."""

from __future__ import annotations

import pytest

from blocks.node_serve import NodeServeSettings
from tasks.compute.kv_budget import (
    GIB,
    Card,
    ModelShape,
    kv_bytes_per_slot,
    kv_fit,
    largest,
    largest_fit,
)
from tasks.preflight.node import slots_check

OLMO3 = ModelShape(layers=64, kv_heads=8, head_dim=128, sliding_layers=48, sliding_window=4096)
CARD = Card(gib=22.5, weights_gib=15.0)


def test_kv_per_token_and_per_slot() -> None:
    # one token on every layer: 2 (K, V) x 64 x 8 x 128 x 2 bytes = 256 KiB; q8_0 34/32 bytes
    # (256 tokens: the cache's smallest size, below)
    full = ModelShape(layers=64, kv_heads=8, head_dim=128)
    assert kv_bytes_per_slot(256, full) == 256 * 256 * 1024
    assert kv_bytes_per_slot(256, full, cache_type="q8_0") == 256 * 136 * 1024
    # 8192 tokens: 16 full layers keep 8192, 48 sliding ones 4096 + 512 (window + ubatch)
    slot = kv_bytes_per_slot(8192, OLMO3)
    assert slot == 4096 * (16 * 8192 + 48 * 4608)
    assert round(slot / GIB, 3) == 1.344
    assert round(kv_bytes_per_slot(8192, OLMO3, cache_type="q8_0") / GIB, 3) == 0.714
    # a context inside the window: the sliding layers keep all of it
    assert kv_bytes_per_slot(2048, OLMO3) == 4096 * 64 * 2048
    assert kv_bytes_per_slot(8192, OLMO3, swa_full=True) == 4096 * 64 * 8192


def test_both_caches_are_padded_to_256_cells() -> None:
    """llama-context.cpp pads each slot's context, llama-kv-cache-iswa.cpp the sliding-window
    cache, to 256 cells: 1000 tokens cost 1024; a 4000-token window + 512 costs 4608."""
    one = ModelShape(layers=1, kv_heads=1, head_dim=1)  # 4 bytes per token at f16
    assert kv_bytes_per_slot(1000, one) == 4 * 1024
    assert kv_bytes_per_slot(1024, one) == 4 * 1024
    assert kv_bytes_per_slot(1025, one) == 4 * 1280
    swa = ModelShape(layers=2, kv_heads=1, head_dim=1, sliding_layers=1, sliding_window=4000)
    assert kv_bytes_per_slot(8000, swa) == 4 * (8192 + 4608)


@pytest.mark.parametrize("flag", ["-kvu", "--kv-unified", "-ub", "--ubatch-size=1024",
                                  "--swa-full"])
def test_flags_that_resize_the_kv_cache_are_refused(flag: str) -> None:
    with pytest.raises(ValueError, match=r"change the KV cache .* remove them"):
        NodeServeSettings(extra_args=["--temp", "0.6", flag])
    assert NodeServeSettings(extra_args=["--temp", "0.6"]).extra_args == ["--temp", "0.6"]


def test_what_fits_beside_the_weights_on_an_l4() -> None:
    assert largest_fit(8192, OLMO3, CARD) == 4
    assert largest_fit(8192, OLMO3, CARD, cache_type="q8_0") == 8
    fit = kv_fit(8, 8192, OLMO3, CARD, cache_type="q8_0")
    assert fit.fits and fit.needed_gib == pytest.approx(15.0 + 1.2 + 8 * 0.7139, abs=1e-3)
    assert not kv_fit(9, 8192, OLMO3, CARD, cache_type="q8_0").fits
    assert largest_fit(8192, OLMO3, Card(gib=22.5, weights_gib=22.0)) == 0


def test_preflight_refuses_slots_that_do_not_fit_with_both_numbers() -> None:
    check = slots_check(NodeServeSettings(kv_cache_type="f16"), 8, 8192)
    assert not check.ok
    assert check.detail == ("8 slots x 8192 tokens: KV 10.75 GiB + weights 15.00 GiB + 1.2 GiB "
                            "buffers = 26.95 GiB of the card's 22.5 GiB (estimate): does not fit")
    assert check.fix == ("set [inference] max_concurrent_requests to 4 or less (the most slots "
                         "of 8192 tokens that fit); kv_cache_type = \"q8_0\" fits 8, or lower "
                         "context_tokens")
    ok = slots_check(NodeServeSettings(kv_cache_type="q8_0"), 8, 8192)
    assert ok.ok and ok.detail.startswith("8 slots x 8192 tokens: KV 5.71 GiB")


def test_an_unknown_cache_type_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError) as e:
        kv_bytes_per_slot(256, OLMO3, cache_type="q5_1")
    assert str(e.value) == "KV cache type 'q5_1': use one of f16, bf16, q8_0, q4_0"


def test_the_fit_is_at_f16_unless_told() -> None:
    # 8 slots x 4096 x (16 x 8192 + 48 x 4608) B = 8 x 1.34375 GiB = 10.75 GiB
    fit = kv_fit(8, 8192, OLMO3, CARD)
    assert fit.kv_gib == 10.75 == kv_fit(8, 8192, OLMO3, CARD, cache_type="f16").kv_gib
    assert fit.text() == ("8 slots x 8192 tokens: KV 10.75 GiB + weights 15.00 GiB + 1.2 GiB "
                          "buffers = 26.95 GiB of the card's 22.5 GiB (estimate)")


def test_the_largest_count_stops_at_its_limit() -> None:
    assert largest(lambda n: n <= 10) == 10
    assert largest(lambda n: True, start=1, limit=5) == 5
    assert largest(lambda n: True) == 1024  # the default limit
    assert largest(lambda n: False) == 0  # not even the start
    assert largest(lambda n: False, start=0) == -1
    # a tiny model on a large card: 1024 slots at most
    assert largest_fit(256, ModelShape(layers=1, kv_heads=1, head_dim=1),
                       Card(gib=80.0, weights_gib=1.0)) == 1024
