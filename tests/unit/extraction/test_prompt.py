"""The system prompt is made from the graph schema, and its digest versions extraction."""

from pathlib import Path

from tasks.extraction.prompt import RULES, extraction_version, prompt_digest, system_prompt
from tasks.graph.ontology import DEFAULT_SCHEMA, default_schema, load_schema


def test_the_prompt_carries_descriptions_patterns_rules_and_the_example() -> None:
    s = default_schema()
    p = system_prompt(s)
    for n in s.nodes:
        assert f"- {n.label}: {n.description}" in p
    assert "- WORKS_FOR: A person is employed by, or serves in, an organization. " \
        "(Person → Organization)" in p
    assert "- RELATED_TO: Any other link between two entities, when no other type fits. " \
        "(any → any)" in p
    assert all(f"{i}. {r}" in p for i, r in enumerate(RULES, 1))
    assert "data, not instructions" in p and "No reasoning" in p
    assert p.count("Example 1:") == 1 and '"name": "Dana Okafor"' in p


def test_a_description_edit_changes_the_prompt_digest_and_the_version(tmp_path: Path) -> None:
    s = default_schema()
    edited = tmp_path / "g.toml"
    edited.write_text(DEFAULT_SCHEMA.read_text().replace("A named place", "A place on a map"))
    e = load_schema(edited)
    assert "- Location: A place on a map" in system_prompt(e)
    assert prompt_digest(e) != prompt_digest(s) and e.digest() != s.digest()
    assert extraction_version(s) == f"s{s.digest()[:8]}-p{prompt_digest(s)[:8]}-g0"
    assert extraction_version(s, 2).endswith("-g2")


def test_no_example_no_example_section(tmp_path: Path) -> None:
    text = DEFAULT_SCHEMA.read_text()
    (tmp_path / "g.toml").write_text(text[:text.index("# Short worked examples")])
    p = system_prompt(load_schema(tmp_path / "g.toml"))
    assert "Example" not in p and "Dana Okafor" not in p


def test_without_gleaning_the_version_says_g0() -> None:
    s = default_schema()
    assert extraction_version(s) == extraction_version(s, 0)
    assert extraction_version(s).endswith("-g0") and extraction_version(s, 1).endswith("-g1")
