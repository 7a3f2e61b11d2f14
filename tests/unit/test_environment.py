"""tasks/environment.py: what makes a node's environment unfit for the deployed code."""

from pathlib import Path

import pytest

from tasks.environment import describe, differences, digest

PYPROJECT = """
[project]
name = "x"
dependencies = [
    "prefect==3.9.1",
    "polars>=1.0",
    "torch>=2.8",
    "Neo4j>=5.19,<5.20",
]
"""


@pytest.fixture
def pyproject(tmp_path: Path) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(PYPROJECT)
    return path


def env(python: str = "3.11", **packages: str | None) -> dict:
    base = {"prefect": "3.9.1", "polars": "1.2.0", "torch": "2.13.0", "neo4j": "5.19.0"}
    return {"python": python, "packages": base | packages}


def test_the_same_environment_differs_in_nothing(pyproject: Path) -> None:
    assert differences(env(), env(), pyproject) == ([], [])


def test_torch_is_never_compared(pyproject: Path) -> None:
    assert differences(env(), env(torch="2.9.0"), pyproject) == ([], [])
    assert differences(env(), env(torch=None), pyproject) == ([], [])
    packages = env()["packages"]
    assert digest("3.11", packages) == digest("3.11", packages | {"torch": "2.9.0"})
    assert digest("3.11", packages) != digest("3.12", packages)
    assert digest("3.11", packages) != digest("3.11", packages | {"polars": "1.3.0"})


def test_what_is_refused_and_what_is_said(pyproject: Path) -> None:
    refused, said = differences(env(), env("3.12", prefect="3.9.0", polars="1.5.0",
                                           neo4j=None), pyproject)
    assert refused == ["Python 3.12 on the node, 3.11 here",
                       "prefect 3.9.0 on the node is outside ==3.9.1",
                       "neo4j is not installed on the node"]
    assert said == ["polars 1.5.0 on the node, 1.2.0 here"]


def test_a_version_outside_a_range_is_refused(pyproject: Path) -> None:
    refused, said = differences(env(), env(neo4j="5.20.0", polars="0.20.1"), pyproject)
    assert refused == ["polars 0.20.1 on the node is outside >=1.0",
                       "neo4j 5.20.0 on the node is outside <5.20,>=5.19"]
    assert said == []


def test_describe_reads_this_interpreter(pyproject: Path) -> None:
    d = describe(pyproject)
    from importlib import metadata

    assert d["packages"]["prefect"] == metadata.version("prefect")
    assert d["packages"]["neo4j"] == metadata.version("neo4j")  # the name as pyproject says it
    assert d["packages"]["torch"] == metadata.version("torch").split("+")[0]
    assert d["digest"] == digest(d["python"], d["packages"])
    assert differences(d, d, pyproject) == ([], [])
