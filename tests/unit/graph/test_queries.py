"""Labels and relationship types reach Cypher as text, so only identifiers pass."""

import pytest

from tasks.graph.queries import entity_label, relationship_type


def test_identifiers_pass() -> None:
    assert entity_label("Person") == "Person"
    assert entity_label("Research_Topic2") == "Research_Topic2"
    assert relationship_type("WORKS_FOR") == "WORKS_FOR"


@pytest.mark.parametrize("bad", ["Person) DETACH DELETE (n", "Entity", "Document", "Chunk",
                                 "lowercase", "", "Person\n", "Per son", "P" + "x" * 64])
def test_entity_labels_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="entity label") as e:
        entity_label(bad)
    assert repr(bad) in str(e.value)


@pytest.mark.parametrize("bad", ["WORKS_FOR]->() DELETE r //", "MENTIONED_IN", "CHUNK_OF",
                                 "Person) DETACH DELETE (n", "Entity", "Chunk",
                                 "lowercase", "Works_For", "", "WORKS_FOR\n"])
def test_relationship_types_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="relationship type") as e:
        relationship_type(bad)
    assert repr(bad) in str(e.value)


def test_labels_and_types_only_as_identifiers() -> None:
    assert entity_label("Person") == "Person"
    for bad in ("Person) DETACH DELETE (n", "Entity:Admin", "person"):
        with pytest.raises(ValueError, match="not an identifier"):
            entity_label(bad)
    with pytest.raises(ValueError, match="not an identifier"):
        relationship_type("WORKS_FOR]->() DELETE r //")
