"""All Cypher the stores run. FalkorDB and Neo4j share every statement except schema setup.

Parameters carry all data. Labels and relationship types cannot be parameters in either
dialect, so they are formatted in only after checking them against the schema whitelists.
"""

from __future__ import annotations

from tasks.extraction.schema import ENTITY_TYPES, RELATIONSHIP_TYPES

SCHEMA = {
    "falkordb": [
        "CREATE INDEX FOR (e:Entity) ON (e.key)",
        "CREATE INDEX FOR (d:Document) ON (d.id)",
    ],
    "neo4j": [
        "CREATE CONSTRAINT entity_key IF NOT EXISTS FOR (e:Entity) REQUIRE e.key IS UNIQUE",
        "CREATE CONSTRAINT document_id IF NOT EXISTS FOR (d:Document) REQUIRE d.id IS UNIQUE",
    ],
}


def entity_label(label: str) -> str:
    if label not in ENTITY_TYPES:
        raise ValueError(f"entity label {label!r} is not in the schema whitelist")
    return label


def relationship_type(rel: str) -> str:
    if rel not in RELATIONSHIP_TYPES:
        raise ValueError(f"relationship type {rel!r} is not in the schema whitelist")
    return rel


UPSERT_DOCUMENTS = """
UNWIND $rows AS row
MERGE (d:Document {id: row.id})
SET d.stream = row.stream, d.path = row.path
"""

# Marks a document as extracted: written last, so a crash before it means "extract again".
MARK_DOCUMENTS = """
UNWIND $rows AS row
MATCH (d:Document {id: row.id})
SET d.hash = row.hash, d.model = row.model, d.prompt_version = row.prompt_version,
    d.extracted_at = row.extracted_at, d.failed_hash = NULL, d.failed_reason = NULL
"""

# A document that failed extraction: remembered so an unchanged copy is not retried (and
# billed) every night; `retry_failed` or a content change tries it again.
MARK_FAILED = """
UNWIND $rows AS row
MERGE (d:Document {id: row.id})
SET d.stream = row.stream, d.path = row.path, d.failed_hash = row.hash,
    d.failed_model = row.model, d.failed_prompt_version = row.prompt_version,
    d.failed_reason = row.message
"""


def upsert_entities(label: str) -> str:
    # ON CREATE sets rows as they are (most rows on a first run); ON MATCH merges lists.
    return f"""
UNWIND $rows AS row
MERGE (e:Entity:{entity_label(label)} {{key: row.key}})
ON CREATE SET e.name = row.name, e.type = row.type, e.first_seen = $now, e.last_seen = $now,
    e.aliases = row.aliases, e.emails = row.emails, e.phones = row.phones,
    e.description = row.description, e.affiliation = row.affiliation
ON MATCH SET e.last_seen = $now,
    e.aliases = e.aliases + [a IN row.aliases WHERE NOT a IN e.aliases],
    e.emails = e.emails + [x IN row.emails WHERE NOT x IN e.emails],
    e.phones = e.phones + [x IN row.phones WHERE NOT x IN e.phones],
    e.description = CASE WHEN size(row.description) > size(e.description)
                         THEN row.description ELSE e.description END,
    e.affiliation = coalesce(row.affiliation, e.affiliation)
"""


UPSERT_MENTIONS = """
UNWIND $rows AS row
MATCH (e:Entity {key: row.key})
MATCH (d:Document {id: row.doc})
MERGE (e)-[:MENTIONED_IN]->(d)
"""


def upsert_relationships(rel: str) -> str:
    return f"""
UNWIND $rows AS row
MATCH (a:Entity {{key: row.src}})
MATCH (b:Entity {{key: row.dst}})
MERGE (a)-[r:{relationship_type(rel)}]->(b)
ON CREATE SET r.doc_ids = row.doc_ids, r.first_seen = $now, r.last_seen = $now,
    r.description = row.description
ON MATCH SET r.doc_ids = r.doc_ids + [x IN row.doc_ids WHERE NOT x IN r.doc_ids],
    r.last_seen = $now,
    r.description = CASE WHEN size(row.description) > size(r.description)
                         THEN row.description ELSE r.description END
"""


# Retraction of a changed or deleted document, in this order (each its own statement: a
# SET then DELETE of the same relationships in one statement deleted nothing on FalkorDB).
# Both endpoints of a relationship are always MENTIONED_IN its supporting documents, so the
# relationships a document supports are found from its mentions.
RETRACT_REL_PROVENANCE = """
UNWIND $ids AS id
MATCH (:Document {id: id})<-[:MENTIONED_IN]-(:Entity)-[r]->(:Entity)
WHERE id IN r.doc_ids
WITH DISTINCT r
SET r.doc_ids = [x IN r.doc_ids WHERE NOT x IN $ids]
"""

DELETE_UNSUPPORTED_RELS = """
UNWIND $ids AS id
MATCH (:Document {id: id})<-[:MENTIONED_IN]-(:Entity)-[r]->(:Entity)
WHERE type(r) <> 'MENTIONED_IN' AND size(r.doc_ids) = 0
WITH DISTINCT r
DELETE r
"""

DELETE_MENTIONS = """
UNWIND $ids AS id
MATCH (:Document {id: id})<-[m:MENTIONED_IN]-()
DELETE m
"""

UNMARK_DOCUMENTS = """
UNWIND $ids AS id
MATCH (d:Document {id: id})
SET d.hash = NULL
"""

DELETE_DOCUMENTS = """
UNWIND $ids AS id
MATCH (d:Document {id: id})
DETACH DELETE d
"""

PRUNE_ORPHANS = """
MATCH (e:Entity)
WHERE NOT (e)-[:MENTIONED_IN]->(:Document)
DETACH DELETE e
RETURN count(e) AS pruned
"""

DOCUMENT_STATES = """
MATCH (d:Document)
RETURN d.id AS id, d.stream AS stream, d.hash AS hash, d.model AS model,
       d.prompt_version AS prompt_version, d.failed_hash AS failed_hash,
       d.failed_model AS failed_model, d.failed_prompt_version AS failed_prompt_version,
       d.failed_reason AS failed_reason
"""

KEYS_BY_EMAIL = """
UNWIND $emails AS em
MATCH (e:Person)
WHERE em IN e.emails
RETURN em AS email, e.key AS key
"""

NODE_COUNTS = "MATCH (n) RETURN labels(n) AS labels, count(n) AS n"
REL_COUNTS = "MATCH ()-[r]->() RETURN type(r) AS type, count(r) AS n"
TOP_ENTITIES = """
MATCH (e:Entity)-[m:MENTIONED_IN]->(:Document)
RETURN e.name AS name, e.type AS type, count(m) AS documents
ORDER BY documents DESC, name ASC
LIMIT $limit
"""
