"""The driver the GPU node needs for PyTorch's CUDA (tasks/engine/cuda_driver.py), against NVIDIA's
minor version compatibility table (docs.nvidia.com/deploy/cuda-compatibility: 12.x from 525.60.13,
13.x from 580.65.06, Linux)."""

from __future__ import annotations

import re

import pytest

from tasks.engine.cuda_driver import MINIMUM, check
from tasks.gcp.spec import GcpSpec
from tasks.shared.errors import ConfigError


def test_the_default_base_images_driver_branch_runs_the_installed_pytorchs_cuda() -> None:
    """Issue 50: the default family was common-cu128-ubuntu-2204-nvidia-570, whose 570 driver
    cannot run PyPI's torch 2.13.0 (CUDA 13): every image build stopped at its install step. A
    Deep Learning VM family's name ends with its driver branch."""
    import torch

    family = GcpSpec.model_fields["base_image"].default
    named = re.fullmatch(r"projects/deeplearning-platform-release/global/images/family/"
                         r"common-cu(\d+)-ubuntu-2204-nvidia-(\d+)", family)
    assert named is not None, family
    assert torch.version.cuda == "13.0"
    assert int(named[2]) >= int(MINIMUM[13].split(".")[0]) == 580


def test_the_570_driver_of_the_cu128_family_runs_cuda_12_and_not_cuda_13() -> None:
    assert check("570.172.08", "2.13.0+cu128", "12.8") == (
        "cuda driver: 570.172.08 runs PyTorch 2.13.0+cu128's CUDA 12.8 (needs 525.60.13 or later)")
    with pytest.raises(ConfigError) as refused:
        check("570.172.08", "2.13.0", "13.0")
    assert str(refused.value).startswith(
        "PyTorch 2.13.0 is built for CUDA 13.0, which needs an NVIDIA driver of 580.65.06 or "
        "later; this machine's is 570.172.08 — set [gcp] base_image to a Deep Learning VM "
        "family with a newer driver")


@pytest.mark.parametrize(("driver", "fits"), [("580.65.06", True), ("580.65.5", False),
                                              ("580.9.99", False), ("1000.1.1", True)])
def test_versions_compare_as_numbers_part_by_part(driver: str, fits: bool) -> None:
    if fits:
        check(driver, "2.13.0", "13.0")
    else:
        with pytest.raises(ConfigError, match="needs an NVIDIA driver of 580.65.06"):
            check(driver, "2.13.0", "13.0")


def test_a_build_without_cuda_and_an_unknown_cuda_are_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"PyTorch 2.13.0\+cpu is a build without CUDA"):
        check("580.95.05", "2.13.0+cpu", None)
    with pytest.raises(ConfigError, match="add it to MINIMUM in tasks/engine/cuda_driver.py"):
        check("580.95.05", "3.0.0", "14.0")
