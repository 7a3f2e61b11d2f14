"""The GceCompute block (blocks/gce.py): the shipped gcp profile builds it, and a bad zone
setup or an incomplete [compute] section is refused naming what is wrong."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.shared.errors import ConfigError
from tests.support.paths import ROOT
from tests.support.profiles import toml_profile


def test_gcp_profile_parses() -> None:
    data = tomllib.loads((ROOT / "profiles" / "gcp.toml").read_text())
    assert data["compute"]["type"] == "gce" and data["graph"]["block"] == "slm-neo4j"
    fields = {k: v for k, v in data["compute"].items() if k != "type"}
    node = GceCompute(**fields)
    assert node.zones() == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert node.node.engine == "llama.cpp" and node.node.prefect_api_url
    assert node.node.tokenizer.startswith("/")
    InferenceEndpoint(**data["inference"])


def test_bad_zone_config_is_refused() -> None:
    with pytest.raises(ValueError, match="repeat a zone"):
        GceCompute(project="p", zone="a", instance="n", fallback_zones=["a"])
    with pytest.raises(ValueError, match="zone_instances names zones not in"):
        GceCompute(project="p", zone="a", instance="n", zone_instances={"b": "x"})


def test_profile_with_incomplete_gce_section_names_the_missing_fields(tmp_path: Path) -> None:
    from tasks.profile import load_profile

    path = toml_profile(tmp_path / "p.toml", compute={"type": "gce", "zone": "us-central1-a",
                                                      "provisioning": "cheap"})
    with pytest.raises(ConfigError) as e:
        load_profile(str(path))
    msg = str(e.value)
    for needle in ("invalid [compute]", "project: Field required", "instance: Field required",
                   "provisioning: Input should be 'spot' or 'on-demand'"):
        assert needle in msg
