"""The graph schema file: what it accepts, what it refuses (naming the file and the fix), the
digest that versions extraction, and the pruning of relationships by its patterns."""

import os
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import TypeAdapter, ValidationError

from tasks.graph.ontology import (
    DEFAULT_SCHEMA,
    _schema_name,
    checked_name,
    default_schema,
    load_schema,
)
from tasks.shared.errors import ConfigError

SMALL = """
unknown_patterns = "{mode}"
fallback_relationship = "RELATED_TO"
patterns = [["Person", "WORKS_FOR", "Organization"], ["*", "RELATED_TO", "*"]]

[[node]]
label = "Person"
description = "A human."

[[node]]
label = "Organization"
description = "A company."
synonyms = ["company"]

[[relationship]]
type = "WORKS_FOR"
description = "Employment."
synonyms = ["EMPLOYED_BY"]

[[relationship]]
type = "RELATED_TO"
description = "Anything else."
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_the_shipped_schema_keeps_todays_types() -> None:
    s = default_schema()
    assert s.entity_types == ("Person", "Organization", "Project", "Topic", "Decision",
                              "Product", "Location", "Event")
    assert s.relationship_types == ("WORKS_FOR", "MEMBER_OF", "PARTICIPATED_IN", "DECIDED",
                                    "OWNS", "LOCATED_IN", "PART_OF", "RELATED_TO")
    assert s.path == str(DEFAULT_SCHEMA) and len(s.examples) == 1


def test_pruning_keeps_reverses_and_drops() -> None:
    s = default_schema()
    assert s.prune("Person", "WORKS_FOR", "Organization") == ("kept", "WORKS_FOR")
    assert s.prune("Organization", "WORKS_FOR", "Person") == ("reversed", "WORKS_FOR")
    assert s.prune("Person", "LOCATED_IN", "Decision") == ("dropped", "LOCATED_IN")
    assert s.prune("Topic", "RELATED_TO", "Decision") == ("kept", "RELATED_TO")  # "*"


def test_fallback_mode_maps_an_unknown_pattern_onto_the_fallback(tmp_path: Path) -> None:
    s = load_schema(write(tmp_path, SMALL.format(mode="fallback")))
    assert s.prune("Organization", "WORKS_FOR", "Organization") == ("fallback", "RELATED_TO")
    drop = load_schema(write(tmp_path, SMALL.format(mode="drop"), "d.toml"))
    assert drop.prune("Organization", "WORKS_FOR", "Organization") == ("dropped", "WORKS_FOR")


def test_labels_map_through_the_files_synonyms(tmp_path: Path) -> None:
    s = load_schema(write(tmp_path, SMALL.format(mode="drop")))
    assert [s.map_entity_type(x) for x in ("Organization", "company", "Companies", "person",
                                           "Spaceship")] == \
        ["Organization", "Organization", "Organization", "Person", None]
    assert s.map_relationship_type("employed by") == ("WORKS_FOR", False)
    assert s.map_relationship_type("LIKES") == ("RELATED_TO", True)


def test_the_digest_follows_meaning_not_layout(tmp_path: Path) -> None:
    base = SMALL.format(mode="drop")
    a = load_schema(write(tmp_path, base, "a.toml")).digest()
    reordered = base.replace('patterns = [["Person", "WORKS_FOR", "Organization"], '
                             '["*", "RELATED_TO", "*"]]',
                             '# a comment\npatterns = [["*", "RELATED_TO", "*"], '
                             '["Person", "WORKS_FOR", "Organization"]]')
    assert load_schema(write(tmp_path, reordered, "b.toml")).digest() == a
    edited = base.replace("A company.", "A firm.")
    assert load_schema(write(tmp_path, edited, "c.toml")).digest() != a


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    p = write(tmp_path, SMALL.format(mode="drop"))
    first = load_schema(p)
    p.write_text(SMALL.format(mode="drop").replace("A human.", "A named human being."))
    assert load_schema(p).node("Person").description == "A named human being."  # type: ignore[union-attr]
    assert load_schema(p).digest() != first.digest()


@pytest.mark.parametrize(("edit", "says"), [
    (('label = "Person"', 'label = "Person) DETACH DELETE (n"'), "must be an identifier"),
    (('label = "Person"', 'label = "Entity"'), "the graph's own"),
    (('type = "WORKS_FOR"', 'type = "works for"'), "upper case with underscores"),
    (('["Person", "WORKS_FOR", "Organization"]', '["Person", "WORKS_FOR", "Robot"]'),
     "'Robot' is not a node label"),
    (('["Person", "WORKS_FOR", "Organization"]', '["Person", "LIKES", "Organization"]'),
     "'LIKES' is not a relationship type"),
    (('fallback_relationship = "RELATED_TO"', 'fallback_relationship = "NOPE"'),
     "fallback_relationship 'NOPE' is not a declared relationship type"),
    (('unknown_patterns = "drop"', 'unknown_patterns = "keep"'), "unknown_patterns"),
    (('description = "A human."', 'description = "A human."\ncolour = "red"'), "colour"),
    (('description = "A human."', 'description = "A human."\nproperties = [{name = "name"}]'),
     "property 'name' is an entity's own field"),
    (('description = "A human."', 'description = "A human."\nproperties = [{name = "Role"}]'),
     "must be a lower-case identifier"),
])
def test_a_bad_file_names_itself_the_place_and_the_fix(tmp_path: Path, edit: tuple[str, str],
                                                        says: str) -> None:
    p = write(tmp_path, SMALL.format(mode="drop").replace(*edit))
    with pytest.raises(ConfigError) as e:
        load_schema(p)
    assert str(p) in str(e.value) and says in str(e.value) and "fix the file" in str(e.value)


def test_a_missing_or_broken_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file — fix \\[extraction\\] schema"):
        load_schema(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_schema(write(tmp_path, "patterns = [", "broken.toml"))


def test_an_example_must_keep_the_patterns_it_teaches(tmp_path: Path) -> None:
    bad = SMALL.format(mode="drop") + """
[[example]]
text = "Acme hired Ann Lee."
entities = [{name = "Ann Lee", type = "Person"}, {name = "Acme", type = "Organization"}]
relationships = [{source = "Acme", type = "WORKS_FOR", target = "Ann Lee"}]
"""
    with pytest.raises(ConfigError, match="Organization WORKS_FOR Person is not an allowed "
                                          "pattern"):
        load_schema(write(tmp_path, bad))


def test_lookups_of_what_the_schema_lacks() -> None:
    s = default_schema()
    assert s.node("Robot") is None and s.requires_grounding("Robot") is False
    assert s.requires_grounding("Person") is True and s.requires_grounding("Topic") is False
    assert s.property_names() == () and s.property_names("Person") == ()


@pytest.mark.parametrize(("entities", "rel", "says"), [
    ('[{name = "Ann Lee", type = "Robot"}]', "", "example[0]: entity 'Ann Lee' has type "
     "'Robot', not a node label"),
    ('[{name = "Ann Lee", type = "Person"}]',
     'relationships = [{source = "Ann Lee", type = "WORKS_FOR", target = "Acme"}]',
     "example[0]: relationship 'Ann Lee' → 'Acme' names an entity the example does not list"),
])
def test_a_bad_example_is_named(tmp_path: Path, entities: str, rel: str, says: str) -> None:
    bad = SMALL.format(mode="drop") + f'\n[[example]]\ntext = "Ann Lee"\nentities = {entities}\n{rel}\n'
    p = write(tmp_path, bad)
    with pytest.raises(ConfigError) as e:
        load_schema(p)
    assert str(e.value) == f"graph schema {p.resolve()}: {says}"


def test_the_refusal_is_the_whole_message_one_line_per_fault(tmp_path: Path) -> None:
    text = SMALL.format(mode="drop").replace('label = "Person"', 'label = "Person) DETACH (n"')
    p = write(tmp_path, text.replace('type = "RELATED_TO"', 'type = "related to"'))
    with pytest.raises(ConfigError) as e:
        load_schema(p)
    fix = (f"fix the file (the shipped one is {DEFAULT_SCHEMA}), or point the profile's "
           "[extraction] schema at another")
    assert str(e.value) == (
        f"graph schema {p}: invalid —\n"
        "  node.0.label: node label 'Person) DETACH (n' must be an identifier starting with a "
        "capital (e.g. 'Person')\n"
        "  relationship.1.type: relationship type 'related to' must be upper case with "
        "underscores (e.g. 'WORKS_FOR')\n" + fix)
    taken = write(tmp_path, SMALL.format(mode="drop").replace('label = "Organization"',
                                                              'label = "Entity"'), "t.toml")
    with pytest.raises(ConfigError) as e:
        load_schema(taken)
    assert str(e.value) == (
        f"graph schema {taken}: invalid —\n"
        "  node.1.label: node label 'Entity' is the graph's own — choose another name\n" + fix)
    robot = write(tmp_path, SMALL.format(mode="drop").replace(
        '["Person", "WORKS_FOR", "Organization"]', '["Person", "WORKS_FOR", "Robot"]'), "r.toml")
    with pytest.raises(ConfigError) as e:  # a fault of the whole file: no place in it
        load_schema(robot)
    assert str(e.value).splitlines()[1] == (
        "  (file): patterns[0] ['Person', 'WORKS_FOR', 'Robot']: 'Robot' is not a node label "
        "(Person, Organization, or '*')")


def test_the_digest_is_pinned_and_every_pattern_counts(tmp_path: Path) -> None:
    # The digest is stored in every extracted document's version: a change to how it is made
    # re-extracts every graph. Pinned for a file with a non-ASCII description; move the pin
    # only on purpose (and say so in the release notes).
    s = load_schema(write(tmp_path, SMALL.format(mode="drop").replace("A human.", "Un café."),
                          "p.toml"))
    assert s.digest() == "2bd03ae782302c84" and s.path == str(tmp_path / "p.toml")
    one_less = SMALL.format(mode="drop").replace('["Person", "WORKS_FOR", "Organization"], ', "")
    assert load_schema(write(tmp_path, one_less, "q.toml")).digest() != \
        load_schema(write(tmp_path, SMALL.format(mode="drop"), "r.toml")).digest()


def test_checked_name_formats_the_value_and_the_reserved_names_into_its_refusals() -> None:
    assert checked_name("Person", "label", "{name!r} bad", "{name!r} taken") == "Person"
    with pytest.raises(ValueError) as e:
        checked_name("not a label", "label", "{name!r}: not one of ours ({reserved})", "-")
    assert str(e.value) == "'not a label': not one of ours (Chunk, Document, Entity, Split)"
    with pytest.raises(ValueError) as e:
        checked_name(7, "type", "{name!r} is no type; reserved: {reserved}", "-")
    assert str(e.value) == "7 is no type; reserved: CHUNK_OF, JOINED, MENTIONED_IN"
    with pytest.raises(ValueError) as e:
        checked_name("MENTIONED_IN", "type", "-", "{name} is taken ({reserved})")
    assert str(e.value) == "MENTIONED_IN is taken (CHUNK_OF, JOINED, MENTIONED_IN)"


@pytest.mark.parametrize(("kind", "good", "bad", "says"), [
    ("label", "Person", "person", "node label 'person' must be an identifier starting with a "
     "capital (e.g. 'Person')"),
    ("label", "Person", "Chunk", "node label 'Chunk' is the graph's own — choose another name"),
    ("type", "WORKS_FOR", "Works_For", "relationship type 'Works_For' must be upper case with "
     "underscores (e.g. 'WORKS_FOR')"),
    ("type", "WORKS_FOR", "CHUNK_OF",
     "relationship type 'CHUNK_OF' is the graph's own — choose another name"),
])
def test_a_schema_name_field_keeps_a_good_name_and_refuses_a_bad_one(
        kind: str, good: str, bad: str, says: str) -> None:
    field = TypeAdapter(Annotated[str, _schema_name(kind)])  # type: ignore[arg-type]
    assert field.validate_python(good) == good
    with pytest.raises(ValidationError) as e:
        field.validate_python(bad)
    assert e.value.errors()[0]["msg"] == f"Value error, {says}"


def test_an_exact_label_wins_over_a_look_alike(tmp_path: Path) -> None:
    # "Organization2" reads as "organization" once its digit is gone: the exact label must win
    text = SMALL.format(mode="drop") + '\n[[node]]\nlabel = "Organization2"\ndescription = "B."\n'
    s = load_schema(write(tmp_path, text))
    assert s.entity_types == ("Person", "Organization", "Organization2")
    assert s.map_entity_type("Organization2") == "Organization2"
    assert s.map_entity_type("organization") == "Organization"


def test_the_fallback_must_itself_fit_both_ends(tmp_path: Path) -> None:
    text = SMALL.format(mode="fallback").replace(
        '["*", "RELATED_TO", "*"]', '["Person", "RELATED_TO", "Person"]')
    s = load_schema(write(tmp_path, text))
    assert s.prune("Person", "WORKS_FOR", "Person") == ("fallback", "RELATED_TO")
    assert s.prune("Organization", "WORKS_FOR", "Person") == ("reversed", "WORKS_FOR")
    assert s.prune("Organization", "WORKS_FOR", "Organization") == ("dropped", "WORKS_FOR")
    assert s.prune("Person", "RELATED_TO", "Organization") == ("dropped", "RELATED_TO")
    assert s.prune("Organization", "RELATED_TO", "Person") == ("dropped", "RELATED_TO")


def test_a_same_size_edit_with_a_new_mtime_is_read_again(tmp_path: Path) -> None:
    p = write(tmp_path, SMALL.format(mode="drop"))
    os.utime(p, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    assert load_schema(p).node("Person").description == "A human."  # type: ignore[union-attr]
    p.write_text(SMALL.format(mode="drop").replace("A human.", "A being."), encoding="utf-8")
    os.utime(p, ns=(1_000_000_002_000_000_000, 1_000_000_002_000_000_000))
    assert load_schema(p).node("Person").description == "A being."  # type: ignore[union-attr]


def test_a_resized_edit_with_the_same_mtime_is_read_again(tmp_path: Path) -> None:
    p = write(tmp_path, SMALL.format(mode="drop"))
    os.utime(p, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    assert load_schema(p).node("Person").description == "A human."  # type: ignore[union-attr]
    p.write_text(SMALL.format(mode="drop").replace("A human.", "A named human being."),
                 encoding="utf-8")
    os.utime(p, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    person = load_schema(p).node("Person")
    assert person is not None and person.description == "A named human being."
