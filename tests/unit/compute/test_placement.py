"""Where a GCE start is tried, in order (tasks/compute/gce/placement.py). The expected orders are
the policy read off the block's docs: every zone with the configured model, then — spot with
on_demand_fallback only — every zone again on-demand."""

import pytest

from tasks.compute.gce.placement import (
    is_stockout,
    placements,
    provisioning_name,
    region_of,
    start_failure,
)

ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]


def test_spot_without_fallback_tries_each_zone_once_on_spot() -> None:
    assert placements(ZONES, "spot", False) == [
        ("us-central1-a", "SPOT"), ("us-central1-b", "SPOT"), ("us-central1-c", "SPOT")]


def test_spot_with_on_demand_fallback_tries_every_zone_on_spot_before_any_on_demand() -> None:
    assert placements(ZONES, "spot", True) == [
        ("us-central1-a", "SPOT"), ("us-central1-b", "SPOT"), ("us-central1-c", "SPOT"),
        ("us-central1-a", "STANDARD"), ("us-central1-b", "STANDARD"),
        ("us-central1-c", "STANDARD")]


@pytest.mark.parametrize("fallback", [False, True])
def test_on_demand_is_tried_once_per_zone_whatever_the_fallback(fallback: bool) -> None:
    assert placements(ZONES, "on-demand", fallback) == [
        ("us-central1-a", "STANDARD"), ("us-central1-b", "STANDARD"),
        ("us-central1-c", "STANDARD")]


def test_one_zone_and_the_zone_order_is_kept() -> None:
    assert placements(["z"], "spot", True) == [("z", "SPOT"), ("z", "STANDARD")]
    assert placements(["c", "a", "b"], "spot", False) == [("c", "SPOT"), ("a", "SPOT"),
                                                          ("b", "SPOT")]
    assert placements([], "spot", True) == []


@pytest.mark.parametrize(("errors", "stocked_out"), [
    ([("ZONE_RESOURCE_POOL_EXHAUSTED", "")], True),
    ([("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "x")], True),
    ([("STOCKOUT", "")], True),
    ([("RESOURCE_POOL_EXHAUSTED", "")], True),
    ([("", "The zone 'projects/p/zones/z' does not have enough resources available to "
            "fulfill the request.")], True),
    ([("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded.")], False),
    ([("ZONE_RESOURCE_POOL", "")], False),  # a prefix of a code is not the code
    ([("QUOTA_EXCEEDED", ""), ("STOCKOUT", "")], True),  # any one error is enough
    ([], False),
])
def test_stockout_is_told_from_other_errors(errors: list[tuple[str, str]],
                                            stocked_out: bool) -> None:
    assert is_stockout(errors) is stocked_out


def test_provisioning_names() -> None:
    assert provisioning_name("SPOT") == "spot"
    assert provisioning_name("STANDARD") == "on-demand"


@pytest.mark.parametrize(("errors", "kind"), [
    ([("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "")], "stocked out"),
    ([("", "The zone 'projects/p/zones/z' does not have enough resources available")],
     "stocked out"),
    ([("QUOTA_EXCEEDED", "Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region "
                         "us-central1.")], "quota exceeded"),
    ([("quotaExceeded", "")], "quota exceeded"),  # a refused call's reason
    ([("UNSUPPORTED_OPERATION", "")], "unsupported"),
    ([("RESOURCE_NOT_FOUND", "")], None),  # another zone would not change it
    ([], None),
])
def test_start_failures_another_placement_may_not_repeat(
        errors: list[tuple[str, str]], kind: str | None) -> None:
    assert start_failure(errors) == kind


def test_region_of_a_zone() -> None:
    assert region_of("us-central1-a") == "us-central1"
    assert region_of("europe-west4-c") == "europe-west4"
