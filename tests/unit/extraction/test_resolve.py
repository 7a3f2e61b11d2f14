from tasks.extraction.resolve import entity_key, looks_like_person_name, resolve, split_name


def test_committee_names_with_and_without_affiliation_are_one_key() -> None:
    a, ra = resolve("Person", "Hon. Anita Anand (Minister of Public Services and Procurement)")
    b, rb = resolve("Person", "Hon. Anita Anand")
    c, _ = resolve("Person", "anita  ANAND")
    assert a == b == c == "Person:anita anand"
    assert ra.affiliation == "Minister of Public Services and Procurement"
    assert rb.affiliation is None and rb.name == "Anita Anand"


def test_role_with_person_in_parentheses_resolves_to_the_person() -> None:
    key, r = resolve("Person", "The Acting Chair (Mr. Bruce Stanton (Simcoe North, CPC))")
    assert key == "Person:bruce stanton"
    assert r.role == "The Acting Chair" and r.affiliation == "Simcoe North, CPC"
    key2, _ = resolve("Person", "The Chair (Hon. Anthony Rota (NipissingTimiskaming, Lib.))")
    assert key2 == "Person:anthony rota"


def test_postnominals_honorifics_and_accents() -> None:
    assert resolve("Person", "Kirsty Williams AM")[0] == "Person:kirsty williams"
    assert resolve("Person", "Mrs. Claude DeBellefeuille")[0] == "Person:claude debellefeuille"
    assert resolve("Person", "Mélanie Joly")[0] == resolve("Person", "Hon. Melanie Joly")[0]
    # Lower-case words that look like post-nominals are part of the name.
    assert split_name("Dr. Am").name == "Am"


def test_non_person_keeps_honorific_words_and_type_scopes_the_key() -> None:
    assert entity_key("Organization", "Acme") != entity_key("Person", "Acme")
    assert resolve("Organization", "Real Reaction (company)")[0] == "Organization:real reaction"


def test_participant_roles_are_not_people() -> None:
    assert looks_like_person_name("Hon. Ahmed Hussen (Minister of Families)")
    assert looks_like_person_name("Steve Davies")
    assert not looks_like_person_name("Grad A")
    assert not looks_like_person_name("Professor B")
    assert not looks_like_person_name("Project Manager")
