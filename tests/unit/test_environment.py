"""tasks/shared/environment.py: what makes a node's environment unfit for the deployed code."""

from pathlib import Path

import pytest

from tasks.shared.environment import describe, differences, digest

PYPROJECT = """
[project]
name = "x"
dependencies = [
    "prefect==3.9.1",
    "polars>=1.0",
    "torch>=2.8",
    "Neo4j>=6.4,<7",
    "gguf==0.19.*",
    "Typing_Extensions>=4",
]
"""


@pytest.fixture
def pyproject(tmp_path: Path) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(PYPROJECT)
    return path


def env(python: str = "3.11", **packages: str | None) -> dict:
    base = {"prefect": "3.9.1", "polars": "1.2.0", "torch": "2.13.0", "neo4j": "6.4.1",
            "gguf": "0.19.0", "typing-extensions": "4.15.0"}
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
    refused, said = differences(env(), env(neo4j="7.0.0", polars="0.20.1"), pyproject)
    assert refused == ["polars 0.20.1 on the node is outside >=1.0",
                       "neo4j 7.0.0 on the node is outside <7,>=6.4"]
    assert said == []


def test_describe_reads_this_interpreter(pyproject: Path) -> None:
    d = describe(pyproject)
    from importlib import metadata

    assert d["packages"]["prefect"] == metadata.version("prefect")
    assert d["packages"]["neo4j"] == metadata.version("neo4j")  # the name as pyproject says it
    assert d["packages"]["torch"] == metadata.version("torch").split("+")[0]
    assert d["digest"] == digest(d["python"], d["packages"])
    assert differences(d, d, pyproject) == ([], [])


def test_a_wildcard_pin_that_differs_is_refused_and_a_prerelease_in_range_said(
        pyproject: Path) -> None:
    refused, said = differences(env(), env(gguf="0.19.1", polars="1.5.0rc1"), pyproject)
    assert refused == ["gguf 0.19.1 on the node, 0.19.0 here"]
    assert said == ["polars 1.5.0rc1 on the node, 1.2.0 here"]


def test_every_requirement_is_looked_at_after_a_missing_one(pyproject: Path) -> None:
    refused, _ = differences(env(), env(polars=None, neo4j="7.0.1", gguf="x.y"), pyproject)
    assert refused == ["polars is not installed on the node",
                       "neo4j 7.0.1 on the node is outside <7,>=6.4",
                       "gguf x.y on the node is outside ==0.19.*"]


def test_a_description_without_packages(pyproject: Path) -> None:
    refused, said = differences({"python": "3.11"}, {"python": "3.11"}, pyproject)
    assert refused == [f"{n} is not installed on the node" for n in
                       ("prefect", "polars", "neo4j", "gguf", "typing-extensions")]
    assert said == []


def test_names_are_normalised_as_pip_does(pyproject: Path) -> None:
    assert "typing-extensions" in describe(pyproject)["packages"]
    _, said = differences(env(), env(**{"typing-extensions": "4.16.0"}), pyproject)
    assert said == ["typing-extensions 4.16.0 on the node, 4.15.0 here"]


def test_the_default_pyproject_is_the_projects() -> None:
    d = describe()
    assert "prefect" in d["packages"] and "falkordb" in d["packages"]
    assert differences(d, d) == ([], [])


def test_the_digest_format() -> None:
    import hashlib

    text = "python==3.11\nneo4j==5.19.0\npolars==1.2.0\nprefect==3.9.1"
    assert digest("3.11", {"prefect": "3.9.1", "polars": "1.2.0", "neo4j": "5.19.0",
                           "torch": "2.13.0"}) == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_a_dotted_name_is_normalised_as_pip_does(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\ndependencies = ["Ruamel.Yaml>=0.17"]\n')
    here = {"python": "3.11", "packages": {"ruamel-yaml": "0.18.6"}}
    node = {"python": "3.11", "packages": {"ruamel-yaml": "0.18.10"}}
    assert differences(here, node, path) == ([], ["ruamel-yaml 0.18.10 on the node, 0.18.6 here"])
    assert differences(here, {"python": "3.11"}, path) == (
        ["ruamel-yaml is not installed on the node"], [])


def test_an_arbitrary_equality_pin_that_differs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\ndependencies = ["legacy-tool===1.0"]\n')
    refused, said = differences({"python": "3.11", "packages": {"legacy-tool": "1.1"}},
                                {"python": "3.11", "packages": {"legacy-tool": "1.0"}}, path)
    assert (refused, said) == (["legacy-tool 1.0 on the node, 1.1 here"], [])
