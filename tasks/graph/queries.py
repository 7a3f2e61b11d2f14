"""All Cypher the stores run. FalkorDB and Neo4j share every statement except schema setup.

Parameters carry all data. Labels and relationship types cannot be parameters in either
dialect, so they are formatted in only after `entity_label` / `relationship_type` check them:
the graph schema is configuration, so the check is the identifier's shape (nothing that can
close a pattern or start a clause) and not a fixed list; names the store itself uses are
refused, so no schema can make a Document an Entity or a fact a MENTIONED_IN.
"""

from __future__ import annotations

from typing import Literal

from tasks.graph.ontology import NameKind, checked_name

Dialect = Literal["falkordb", "neo4j"]  # which schema statements a store runs

# Each node kind's key: MERGE finds a node by it. Neo4j enforces each with a unique constraint
# (which also indexes it); FalkorDB indexes each (tasks/graph/falkordb_store.py).
# A Split (an operator's `graph split`: this form never joins that entity) is keyed by its
# entity's key and the form, "<key>\n<form>".
UNIQUE_KEYS: tuple[tuple[str, str, str], ...] = (
    ("entity_key", "Entity", "key"), ("document_id", "Document", "id"), ("chunk_id", "Chunk", "id"),
    ("split_id", "Split", "id"))

SCHEMA: dict[Dialect, list[str]] = {
    # and the Persons' addresses: KEYS_BY_EMAIL's `em IN e.emails` uses a range index on an
    # array (docs.falkordb.com/cypher/indexing/range-index: "arrays containing scalar
    # values"); without it, each batch's lookup scans every Person (50× slower at 50k)
    "falkordb": [f"CREATE INDEX FOR (n:{label}) ON (n.{prop})" for _, label, prop in UNIQUE_KEYS]
    + ["CREATE INDEX FOR (n:Person) ON (n.emails)"],
    "neo4j": [f"CREATE CONSTRAINT {name} IF NOT EXISTS FOR (n:{label}) REQUIRE n.{prop} IS UNIQUE"
              for name, label, prop in UNIQUE_KEYS],
}
# Indexes no key owns, after SCHEMA: a namesake found by its name's key (PEOPLE_NAMED).
INDEXES: dict[Dialect, list[str]] = {
    "falkordb": ["CREATE INDEX FOR (n:Person) ON (n.namesake_of)"],
    "neo4j": ["CREATE INDEX person_namesake_of IF NOT EXISTS FOR (n:Person) ON (n.namesake_of)"],
}

# Neo4j only: what holds each key now. A uniqueness constraint or a node key enforces it (each
# owns an index); an index that no constraint owns blocks the constraint's creation.
SHOW_KEY_CONSTRAINTS = """
SHOW CONSTRAINTS YIELD name, type, entityType, labelsOrTypes, properties
WHERE entityType = 'NODE' AND type IN ['UNIQUENESS', 'NODE_PROPERTY_UNIQUENESS', 'NODE_KEY']
RETURN name, labelsOrTypes AS labels, properties
"""
SHOW_FREE_INDEXES = """
SHOW INDEXES YIELD name, entityType, labelsOrTypes, properties, owningConstraint
WHERE entityType = 'NODE' AND owningConstraint IS NULL AND labelsOrTypes IS NOT NULL
RETURN name, labelsOrTypes AS labels, properties
"""


def duplicate_keys(label: str, prop: str) -> str:
    """Up to 5 values of `prop` that more than one `label` node holds (a constraint cannot be
    created over them). Label and property come from UNIQUE_KEYS, never from input."""
    return (f"MATCH (n:{label}) WHERE n.{prop} IS NOT NULL WITH n.{prop} AS value, count(*) AS n "
            "WHERE n > 1 RETURN value, n ORDER BY value LIMIT 5")


# What a store's caller is told: (not an identifier, one of the store's own).
_STORE_NAME_ERRORS: dict[NameKind, tuple[str, str]] = {
    "label": ("entity label {name!r} is not an identifier: a label starts with a capital letter "
              "and has up to 64 letters, digits or underscores — fix it in the graph schema",
              "entity label {name!r} is reserved by the graph store ({reserved}) — rename it in "
              "the graph schema"),
    "type": ("relationship type {name!r} is not an identifier: a type starts with a capital "
             "letter and has up to 64 capitals, digits or underscores — fix it in the graph "
             "schema",
             "relationship type {name!r} is reserved by the graph store ({reserved}) — rename "
             "it in the graph schema")}


def entity_label(label: str) -> str:
    return checked_name(label, "label", *_STORE_NAME_ERRORS["label"])


def relationship_type(rel: str) -> str:
    return checked_name(rel, "type", *_STORE_NAME_ERRORS["type"])


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
    e.aliases = [a IN row.aliases WHERE a <> row.name], e.emails = row.emails,
    e.phones = row.phones, e.namesake_of = row.namesake_of,
    e.description = row.description, e.affiliation = row.affiliation
ON MATCH SET e.last_seen = $now,
    e.aliases = e.aliases + [a IN row.aliases WHERE NOT a IN e.aliases AND a <> e.name],
    e.emails = e.emails + [x IN row.emails WHERE NOT x IN e.emails],
    e.phones = e.phones + [x IN row.phones WHERE NOT x IN e.phones],
    e.description = CASE WHEN size(row.description) > size(e.description)
                         THEN row.description ELSE e.description END,
    e.affiliation = coalesce(row.affiliation, e.affiliation)
SET e += row.properties
"""


# A chunk is written only with its document (MATCH first), so every Chunk has a CHUNK_OF
# and retraction finds them all through the document.
UPSERT_CHUNKS = """
UNWIND $rows AS row
MATCH (d:Document {id: row.document})
MERGE (c:Chunk {id: row.id})
SET c.document = row.document, c.index = row.index, c.start = row.start, c.end = row.end,
    c.text = row.text
MERGE (c)-[:CHUNK_OF]->(d)
"""

# MENTIONED_IN.chunks: the sorted chunk indexes of that document naming the entity ([] for
# deterministic data). Merged on match like doc_ids (retraction is what removes); Cypher has
# no list sort without APOC, so the union is read off range(0, its maximum). Parenthesised:
# FalkorDB binds IN and STARTS WITH tighter than +.
UPSERT_MENTIONS = """
UNWIND $rows AS row
MATCH (e:Entity {key: row.key})
MATCH (d:Document {id: row.doc})
MERGE (e)-[m:MENTIONED_IN]->(d)
ON CREATE SET m.chunks = row.chunks
ON MATCH SET m.chunks = [i IN range(0, reduce(top = -1, x IN (coalesce(m.chunks, []) + row.chunks)
                                              | CASE WHEN x > top THEN x ELSE top END))
                         WHERE i IN (coalesce(m.chunks, []) + row.chunks)]
"""


# A join: a document's name put under an entity by evidence beyond the name (an e-mail address,
# the document's context, a surname) — (entity)-[:JOINED {form}]->(document), what `graph
# merges` lists and `graph split` undoes. Retracted with the document's mentions.
UPSERT_JOINS = """
UNWIND $rows AS row
MATCH (e:Entity {key: row.key})
MATCH (d:Document {id: row.doc})
MERGE (e)-[j:JOINED {form: row.form}]->(d)
ON CREATE SET j.evidence = row.evidence, j.at = $now
ON MATCH SET j.evidence = row.evidence
"""

MERGES = """
MATCH (e:Entity)-[j:JOINED]->(d:Document)
WHERE $key IS NULL OR e.key = $key
RETURN j.at AS at, e.key AS key, e.name AS name, j.form AS form, j.evidence AS evidence,
       d.id AS document
ORDER BY at DESC, key, form, document
LIMIT $limit
"""

SPLITS = "MATCH (s:Split) RETURN s.key AS key, s.form AS form, s.at AS at ORDER BY at DESC, key"

ADD_SPLIT = """
UNWIND $forms AS form
MERGE (s:Split {id: $key + '\n' + form})
ON CREATE SET s.key = $key, s.form = form, s.at = $now
WITH DISTINCT $key AS key
MATCH (e:Entity {key: key})
SET e.aliases = [a IN e.aliases WHERE NOT toLower(a) IN $forms]
"""


def upsert_relationships(rel: str) -> str:
    return f"""
UNWIND $rows AS row
MATCH (a:Entity {{key: row.src}})
MATCH (b:Entity {{key: row.dst}})
MERGE (a)-[r:{relationship_type(rel)}]->(b)
ON CREATE SET r.doc_ids = row.doc_ids, r.chunks = row.chunks, r.first_seen = $now,
    r.last_seen = $now, r.description = row.description
ON MATCH SET r.doc_ids = r.doc_ids + [x IN row.doc_ids WHERE NOT x IN r.doc_ids],
    r.chunks = coalesce(r.chunks, []) + [x IN row.chunks WHERE NOT x IN coalesce(r.chunks, [])],
    r.last_seen = $now,
    r.description = CASE WHEN size(row.description) > size(r.description)
                         THEN row.description ELSE r.description END
"""


# Retraction of a changed or deleted document, in this order (each its own statement: a
# SET then DELETE of the same relationships in one statement deleted nothing on FalkorDB).
# Both endpoints of a relationship are always MENTIONED_IN its supporting documents, so the
# relationships a document supports are found from its mentions. A chunk id is
# "<document id>#<index>": the rest after the id and "#" holds no "#", so retracting "a"
# keeps the chunks of a document called "a#1".
RETRACT_REL_PROVENANCE = """
UNWIND $ids AS id
MATCH (:Document {id: id})<-[:MENTIONED_IN]-(:Entity)-[r]->(:Entity)
WHERE id IN r.doc_ids
WITH DISTINCT r
SET r.doc_ids = [x IN r.doc_ids WHERE NOT x IN $ids],
    r.chunks = [c IN coalesce(r.chunks, [])
                WHERE NOT any(gone IN $ids WHERE c STARTS WITH (gone + '#')
                              AND NOT (substring(c, size(gone) + 1) CONTAINS '#'))]
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

DELETE_JOINS = """
UNWIND $ids AS id
MATCH (:Document {id: id})<-[j:JOINED]-()
DELETE j
"""

# A document's chunks are deleted in transactions bounded like the upserts (the store reads
# their sizes first, then deletes by id): Neo4j counts a deleted node's properties against the
# transaction's memory cap, and a batch of transcripts holds thousands of chunks.
CHUNK_SIZES = """
UNWIND $ids AS id
MATCH (c:Chunk)-[:CHUNK_OF]->(:Document {id: id})
RETURN c.id AS id, size(c.text) AS bytes
"""

DELETE_CHUNKS = """
UNWIND $rows AS row
MATCH (c:Chunk {id: row.id})
DETACH DELETE c
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

# Deletions of small nodes (entities, and what is left once the chunks are gone) run in
# transactions of at most $limit nodes: each says how many it deleted, and the store repeats
# it until none is left.
PRUNE_ORPHANS = """
MATCH (e:Entity)
WHERE NOT (e)-[:MENTIONED_IN]->(:Document)
WITH e LIMIT $limit
DETACH DELETE e
RETURN count(e) AS deleted
"""

CLEAR = """
MATCH (n)
WITH n LIMIT $limit
DETACH DELETE n
RETURN count(n) AS deleted
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

# The Persons a name-only mention of each name key could be: the one of that key and its
# namesakes (each with its addresses, phones and employers: the evidence a document's context
# meets).
_PERSON_EVIDENCE = """
OPTIONAL MATCH (p)-[:WORKS_FOR]->(o:Entity)
RETURN k AS name, p.key AS key, p.emails AS emails, p.phones AS phones,
       collect(o.key) AS employers
"""
PEOPLE_NAMED = ("UNWIND $keys AS k\nMATCH (p:Entity {key: k})" + _PERSON_EVIDENCE + "UNION ALL\n"
                "UNWIND $keys AS k\nMATCH (p:Person {namesake_of: k})" + _PERSON_EVIDENCE)

# The phones of the Persons of each name key: the one of that key and its namesakes.
_PHONES = "UNWIND coalesce(p.phones, []) AS ph\nRETURN ph AS phone, p.key AS key\n"
PHONES_OF_NAMES = ("UNWIND $keys AS k\nMATCH (p:Person {key: k})\n" + _PHONES + "UNION ALL\n"
                   "UNWIND $keys AS k\nMATCH (p:Person {namesake_of: k})\n" + _PHONES)

# The Persons who work for each organization key, with their names: the candidates a contact
# with another spelling of a name (an initial, a nickname) and that employer could be.
COLLEAGUES = """
UNWIND $orgs AS k
MATCH (p:Person)-[:WORKS_FOR]->(:Entity {key: k})
RETURN k AS org, p.key AS key, p.name AS name
"""

EMAILS_OF_KEYS = """
UNWIND $keys AS k
MATCH (e:Entity {key: k})
UNWIND e.emails AS em
RETURN em AS email, e.key AS key
"""

# The text behind a fact: one row per chunk, by document then chunk index. `end` quoted:
# Neo4j reserves END (CASE … END) as a variable name.
EVIDENCE_COLUMNS = """
RETURN d.id AS document, d.path AS path, c.index AS chunk, c.start AS start, c.`end` AS `end`,
       c.text AS text
ORDER BY document, chunk
"""

ENTITY_EVIDENCE = """
MATCH (:Entity {key: $key})-[m:MENTIONED_IN]->(d:Document)<-[:CHUNK_OF]-(c:Chunk)
WHERE c.index IN coalesce(m.chunks, [])
""" + EVIDENCE_COLUMNS


def relationship_evidence(rel: str) -> str:
    return f"""
MATCH (:Entity {{key: $src}})-[r:{relationship_type(rel)}]->(:Entity {{key: $dst}})
UNWIND coalesce(r.chunks, []) AS cid
MATCH (c:Chunk {{id: cid}})-[:CHUNK_OF]->(d:Document)
""" + EVIDENCE_COLUMNS


NODE_COUNTS = "MATCH (n) RETURN labels(n) AS labels, count(n) AS n"
REL_COUNTS = "MATCH ()-[r]->() RETURN type(r) AS type, count(r) AS n"
TOP_ENTITIES = """
MATCH (e:Entity)-[m:MENTIONED_IN]->(:Document)
RETURN e.name AS name, e.type AS type, count(m) AS documents
ORDER BY documents DESC, name ASC
LIMIT $limit
"""
