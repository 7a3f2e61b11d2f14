"""Both nodes implement the one compute interface (tasks/compute/protocol.py) fully and with
the same signatures, and the factory builds the node each block describes — so flows never
ask which kind of node they hold."""

import inspect
from pathlib import Path

import pytest

from blocks.compute import LocalCompute
from blocks.gce import GceCompute
from tasks.compute.gce.lifecycle import GceNode
from tasks.compute.local import LocalNode
from tasks.compute.protocol import Node, node_for
from tasks.shared.errors import ConfigError

METHODS = ["prepare", "start", "start_inference", "stop_inference", "inference_running", "request_stop",
           "stop", "check_running", "running", "signal_stops", "usage", "engine_here"]
ATTRIBUTES = ["remote_training", "loads_adapters", "base_model", "cpu_threads", "watch_seconds",
              "boot_timeout_seconds", "stop_timeout_seconds", "server_exit"]


def gce_block() -> GceCompute:
    return GceCompute(project="p", zone="z", instance="n", state_dir="/nonexistent")


def test_the_protocol_is_what_the_issue_names() -> None:
    members = {n for n in [*dir(Node), *Node.__annotations__] if not n.startswith("_")}
    assert members == set(METHODS) | set(ATTRIBUTES)


@pytest.mark.parametrize("name", METHODS)
def test_both_nodes_have_the_protocol_signature(name: str) -> None:
    want = inspect.signature(getattr(Node, name))
    assert inspect.signature(getattr(LocalNode, name)) == want
    assert inspect.signature(getattr(GceNode, name)) == want


def test_the_factory_builds_the_node_the_block_describes() -> None:
    local = node_for(LocalCompute(state_dir="/nonexistent", model_path="/m.gguf", n_threads=3))
    gce = node_for(gce_block())
    assert type(local) is LocalNode and type(gce) is GceNode
    assert isinstance(local, Node) and isinstance(gce, Node)
    # what the flows ask instead of the node's type
    assert (local.remote_training, local.loads_adapters, local.base_model, local.cpu_threads) \
        == (False, True, "/m.gguf", 3)
    assert (gce.remote_training, gce.loads_adapters, gce.base_model, gce.cpu_threads) \
        == (True, False, None, 2)
    assert local.server_exit is not None and gce.server_exit is None
    assert gce.engine_here(Path("/elsewhere")) is None
    with pytest.raises(ConfigError, match="no node for a str block"):
        node_for("local")  # type: ignore[arg-type]


def test_the_local_node_has_nothing_to_preempt_reap_or_pay() -> None:
    node = LocalNode(LocalCompute(state_dir="/nonexistent"))
    assert node.check_running() is None
    assert node.running() == {}  # no server of ours: nothing for the reaper
    assert node.stop() == []
    assert node.usage().model_dump() == {"running_seconds": 0.0, "gpu_hours": 0.0, "estimated_usd": 0.0,
                            "zones": {}, "note": "local machine: no cost"}


def test_only_a_local_node_runs_an_engine_here_and_watches_it(tmp_path: Path) -> None:
    from tasks.compute.protocol import gce_block as gce_of

    local = node_for(LocalCompute(state_dir="/nonexistent", model_path="/m.gguf", n_threads=3))
    here = local.engine_here(tmp_path / "eval-engine")
    assert type(here) is LocalNode and here.block.state_dir == str(tmp_path / "eval-engine")
    assert (here.base_model, here.cpu_threads) == ("/m.gguf", 3)
    assert here.server_exit is not None and here.server_exit() is None  # no server of ours
    gce = gce_block()
    assert gce_of(gce) is gce and gce_of(LocalCompute()) is None


def test_on_a_signal_the_cli_stops_the_local_server_and_nothing_of_a_gce_node(tmp_path: Path) -> None:
    local = node_for(LocalCompute(state_dir=str(tmp_path), model_path="/m.gguf", n_threads=1))
    [(what, server, _stop)] = local.signal_stops()
    assert what == "the inference server (llama.cpp)"
    assert (server.name, server.state_dir) == ("inference", tmp_path)  # inference.pid.json
    assert node_for(gce_block()).signal_stops() == []


def test_nodes_for_names_node_i_after_the_first_in_every_zone() -> None:
    from tasks.compute.protocol import nodes_for

    block = GceCompute(project="p", zone="z1", instance="n", fallback_zones=["z2", "z3"],
                       zone_instances={"z2": "n-west"}, nodes=3, state_dir="/nonexistent")
    nodes = nodes_for(block)
    assert [type(n) for n in nodes] == [GceNode] * 3
    assert nodes[0].block is block  # type: ignore[attr-defined]
    assert [[n.block.instance_in(z) for z in ("z1", "z2", "z3")]  # type: ignore[attr-defined]
            for n in nodes] == [["n", "n-west", "n"], ["n-2", "n-west-2", "n-2"],
                                ["n-3", "n-west-3", "n-3"]]
    # the same zones, fallbacks and provisioning; a node record of its own
    assert {(tuple(n.block.zones()), n.block.provisioning, n.block.nodes)  # type: ignore[attr-defined]
            for n in nodes[1:]} == {(("z1", "z2", "z3"), "spot", 1)}
    assert [n.record.path.name for n in nodes] == [  # type: ignore[attr-defined]
        "gce-n.json", "gce-n-2.json", "gce-n-3.json"]
    assert len(nodes_for(gce_block())) == 1


def test_a_local_profile_has_one_node_and_refuses_more(tmp_path: Path) -> None:
    from tasks.compute.protocol import nodes_for
    from tasks.profile import load_profile
    from tests.support.profiles import toml_profile

    [local] = nodes_for(LocalCompute(state_dir=str(tmp_path)))
    assert type(local) is LocalNode
    one = load_profile(str(toml_profile(tmp_path / "one.toml", state_dir=tmp_path,
                                        compute={"type": "local", "nodes": 1})))
    assert [type(n) for n in one.nodes] == [LocalNode] and one.node is one.nodes[0]
    with pytest.raises(ConfigError, match=r"nodes > 1 needs GCE nodes.*use a GCE profile"):
        load_profile(str(toml_profile(tmp_path / "two.toml", state_dir=tmp_path,
                                      compute={"type": "local", "nodes": 2})))
    with pytest.raises(ValueError, match="less than or equal to 16"):
        GceCompute(project="p", zone="z", instance="n", nodes=17)


def test_several_nodes_refuse_one_fixed_inference_url(tmp_path: Path) -> None:
    """Each node serves phase 1 at its own address: a fixed base_url would send every node's
    share to one server while the others idle (and are paid for)."""
    from tasks.profile import load_profile
    from tests.support.profiles import toml_profile

    gce = {"type": "gce", "project": "p", "zone": "z", "instance": "n", "nodes": 2}
    with pytest.raises(ConfigError, match=r"nodes = 2 with \[inference\] base_url "
                                          r"'http://10.0.0.5:9080' — drop base_url"):
        load_profile(str(toml_profile(tmp_path / "p.toml", state_dir=tmp_path, compute=gce,
                                      inference={"base_url": "http://10.0.0.5:9080"})))
    two = load_profile(str(toml_profile(tmp_path / "q.toml", state_dir=tmp_path, compute=gce)))
    assert len(two.nodes) == 2
