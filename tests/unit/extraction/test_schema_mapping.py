"""Label mapping: what a model writes as a type becomes a whitelisted label, or nothing.

The expected labels are read off the whitelists' meaning (a company is an Organization), not
off the synonym tables."""

from collections import Counter

import pytest

from tasks.extraction.schema import (
    ENTITY_TYPES,
    FALLBACK_RELATIONSHIP,
    RELATIONSHIP_TYPES,
    SchemaViolation,
    json_schema,
    map_entity_type,
    map_relationship_type,
    parse_answer,
)


@pytest.mark.parametrize("label", ENTITY_TYPES)
def test_every_whitelisted_entity_label_maps_to_itself(label: str) -> None:
    assert map_entity_type(label) == label
    assert map_entity_type(label.lower()) == label
    assert map_entity_type(label.upper()) == label


@pytest.mark.parametrize(("raw", "label"), [
    ("company", "Organization"), ("companies", "Organization"), ("Companies", "Organization"),
    ("agencies", "Organization"), ("parties", "Organization"), ("universities", "Organization"),
    ("organisations", "Organization"), ("ORG", "Organization"), ("teams", "Organization"),
    ("people", "Person"), ("persons", "Person"), ("speakers", "Person"),
    ("Ministers", "Person"), ("individual", "Person"),
    ("cities", "Location"), ("countries", "Location"), ("places", "Location"),
    ("policies", "Topic"), ("bills", "Topic"), ("laws", "Topic"), ("issues", "Topic"),
    ("programmes", "Project"), ("initiatives", "Project"),
    ("decisions", "Decision"), ("motions", "Decision"),
    ("products", "Product"), ("devices", "Product"),
    ("meetings", "Event"), ("conferences", "Event"), ("sessions", "Event"),
    ("Organization!", "Organization"), ("per-son", "Person"), ("  event  ", "Event"),
])
def test_synonyms_plurals_and_case_map_onto_the_whitelist(raw: str, label: str) -> None:
    assert map_entity_type(raw) == label


@pytest.mark.parametrize("raw", ["", "s", "ss", "Spaceship", "thing", "business", "class",
                                 "classes", "sess", "ies", "es"])
def test_unknown_types_are_rejected(raw: str) -> None:
    assert map_entity_type(raw) is None


@pytest.mark.parametrize("rtype", RELATIONSHIP_TYPES)
def test_every_whitelisted_relationship_maps_to_itself_without_fallback(rtype: str) -> None:
    assert map_relationship_type(rtype) == (rtype, False)
    assert map_relationship_type(rtype.lower().replace("_", " ")) == (rtype, False)
    assert map_relationship_type(rtype.lower().replace("_", "-")) == (rtype, False)


@pytest.mark.parametrize(("raw", "rtype"), [
    ("EMPLOYED_BY", "WORKS_FOR"), ("works at", "WORKS_FOR"), ("employee-of", "WORKS_FOR"),
    ("belongs to", "MEMBER_OF"), ("PART_OF_TEAM", "MEMBER_OF"),
    ("attended", "PARTICIPATED_IN"), ("spoke at", "PARTICIPATED_IN"),
    ("presented_at", "PARTICIPATED_IN"),
    ("made decision", "DECIDED"), ("approved", "DECIDED"),
    ("owned by", "OWNS"), ("has", "OWNS"),
    ("based in", "LOCATED_IN"), ("in", "LOCATED_IN"), ("subpart of", "PART_OF"),
    ("  works   for ", "WORKS_FOR"), ("Located-In!", "LOCATED_IN"),
])
def test_relationship_synonyms_map_without_counting_a_fallback(raw: str, rtype: str) -> None:
    assert map_relationship_type(raw) == (rtype, False)


@pytest.mark.parametrize("raw", ["", "LIKES", "knows", "mentioned with", "RELATED TO X"])
def test_unknown_relationships_fall_back_to_related_to_and_say_so(raw: str) -> None:
    assert FALLBACK_RELATIONSHIP == "RELATED_TO"
    assert map_relationship_type(raw) == ("RELATED_TO", True)


def answer(entity_types: list[object], rel_types: list[object]) -> dict[str, object]:
    ents = [{"name": f"N{i}", "type": t, "description": ""} for i, t in enumerate(entity_types)]
    rels = [{"source": "N0", "target": "N1", "type": t, "description": ""} for t in rel_types]
    return {"entities": ents, "relationships": rels}


def test_off_enum_entity_labels_are_mapped_or_their_items_dropped_and_counted() -> None:
    ex = parse_answer(answer(["companies", "Spaceship", "", "Person", "Spaceship"], []),
                      json_schema(10, 10))
    assert [(e.name, e.type) for e in ex.entities] == [("N0", "Organization"), ("N3", "Person")]
    assert ex.repairs.rejected_entity_types == Counter({"Spaceship": 2, "(empty)": 1})
    assert ex.repairs.remapped_relationship_types == Counter()


def test_off_enum_relationship_labels_map_and_only_fallbacks_are_counted() -> None:
    ex = parse_answer(answer(["Person", "Person"], ["employed by", "likes", "PART_OF", "likes",
                                                    "Likes"]), json_schema(10, 10))
    assert [r.type for r in ex.relationships] == ["WORKS_FOR", "RELATED_TO", "PART_OF",
                                                  "RELATED_TO", "RELATED_TO"]
    assert ex.repairs.remapped_relationship_types == Counter({"likes": 2, "Likes": 1})
    assert ex.repairs.rejected_entity_types == Counter()


def test_a_mapped_label_outside_the_sent_enum_is_rejected_too() -> None:
    schema = json_schema(10, 10)
    schema["properties"]["entities"]["items"]["properties"]["type"]["enum"] = ["Person"]
    schema["properties"]["relationships"]["items"]["properties"]["type"]["enum"] = ["OWNS"]
    ex = parse_answer(answer(["Person", "companies"], []), schema)
    assert [e.type for e in ex.entities] == ["Person"]
    assert ex.repairs.rejected_entity_types == Counter({"companies": 1})
    with pytest.raises(SchemaViolation, match=r"relationships\[0\].type: 'likes' is not one of "
                                              r"\['OWNS'\]") as e:
        parse_answer(answer(["Person", "Person"], ["likes"]), schema)
    assert e.value.bound == "relationships[].type: enum"


def test_a_label_that_is_no_string_breaks_the_schema() -> None:
    with pytest.raises(SchemaViolation, match=r"entities\[0\].type: expected string, got integer"):
        parse_answer(answer([3], []), json_schema(10, 10))
    schema = {"type": "object", "properties": {"mood": {"type": "string",
                                                        "enum": ["happy", "sad"]}}}
    with pytest.raises(SchemaViolation, match=r"mood: 'Happy' is not one of \['happy', 'sad'\]"):
        parse_answer({"mood": "Happy"}, schema)


def test_only_relationship_types_are_mapped_not_another_enum_of_the_same_labels() -> None:
    # "likes" would map to RELATED_TO as a relationship type; in another field it is held to
    # the enum as written
    schema = {"type": "object", "properties": {"link": {"type": "string",
                                                        "enum": ["OWNS", "RELATED_TO"]}}}
    with pytest.raises(SchemaViolation) as e:
        parse_answer({"link": "likes"}, schema)
    assert str(e.value) == "link: 'likes' is not one of ['OWNS', 'RELATED_TO']"
