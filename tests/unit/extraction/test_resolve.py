import pytest

from tasks.extraction.resolve import (
    entity_key,
    looks_like_person_name,
    normalize,
    phone_key,
    phones_in,
    resolve,
    split_name,
    variant_of,
)


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


def test_honorifics_come_off_person_names_only() -> None:
    assert resolve("Person", "Dr. Pepper") == ("Person:pepper", split_name("Dr. Pepper"))
    assert split_name("Dr. Pepper").name == "Pepper"
    for label in ("Product", "Organization"):
        key, r = resolve(label, "Dr. Pepper")
        assert (key, r.name) == (f"{label}:dr pepper", "Dr. Pepper")
    key, r = resolve("Organization", "Senator Hotel MP")
    assert (key, r.name) == ("Organization:senator hotel mp", "Senator Hotel MP")


def test_stacked_honorifics_and_dotless_forms() -> None:
    assert split_name("The Right Honourable Dr. Jane Roe").name == "Jane Roe"
    assert split_name("Rt. Hon. Sir Keir Starmer KC MP").name == "Keir Starmer"
    assert split_name("Mr.Smith").name == "Smith"  # a dotted honorific needs no space
    assert split_name("Mr Smith").name == "Smith"
    assert split_name("Mrsmith Jones").name == "Mrsmith Jones"  # no dot, no space: a name
    assert split_name("Drew Barrymore").name == "Drew Barrymore"
    assert split_name("Hon").name == "Hon"  # nothing but an honorific: kept as written


def test_postnominals_need_capitals_and_a_name_before_them() -> None:
    assert split_name("Jane Doe M.P.").name == "Jane Doe"
    assert split_name("Jane Doe PhD").name == "Jane Doe PhD"  # not all capitals
    assert split_name("Jane Doe PHD OBE").name == "Jane Doe"
    assert split_name("MP").name == "MP"
    assert split_name("Jane MP").name == "Jane"  # one word before them is a name
    assert split_name("Ms MP").name == "MP"


def test_trailing_parentheses_nest_and_unbalanced_ones_stay() -> None:
    r = split_name("Jane Roe (Chair (Finance))")
    assert (r.name, r.affiliation, r.role) == ("Jane Roe", "Chair (Finance)", None)
    assert split_name("Jane Roe (MP").name == "Jane Roe (MP"
    r = split_name("Jane Roe MP)")
    assert (r.name, r.affiliation) == ("Jane Roe MP)", None)
    r = split_name("(Jane Roe)")
    assert (r.name, r.affiliation) == ("(Jane Roe)", "Jane Roe")  # nothing before: raw kept


def test_a_role_prefix_without_an_honorific_inside_is_an_affiliation() -> None:
    r = split_name("The Chair (Finance Committee)")
    assert (r.name, r.affiliation, r.role) == ("The Chair", "Finance Committee", None)
    r = split_name("The Deputy Speaker (Ms. Carol Hughes (Algoma))")
    assert (r.name, r.affiliation, r.role) == ("Carol Hughes", "Algoma", "The Deputy Speaker")
    r = split_name("The Chair (Mr. Joe Bloggs)", person=False)
    assert (r.name, r.affiliation, r.role) == ("The Chair", "Mr. Joe Bloggs", None)


def test_normalize_folds_case_accents_space_and_punctuation() -> None:
    assert normalize("  Ché   GUEVARA. ") == "che guevara"
    assert normalize("O'Brien & Sons-Ltd") == "o'brien & sons-ltd"
    assert normalize("A.B,C") == "a b c"
    assert normalize("Straße") == "strasse"
    assert entity_key("Topic", "Budget  2024!") == "Topic:budget 2024"


def test_the_raw_spelling_is_kept() -> None:
    assert split_name("  Hon.  Jane Roe (Finance) ").raw == "  Hon.  Jane Roe (Finance) "
    assert resolve("Topic", "Budget")[1].raw == "Budget"


def test_whitespace_and_unicode_forms_are_one_name() -> None:
    assert split_name("Anita\u00a0 Anand\n").name == "Anita Anand"
    assert resolve("Person", "ｊａｎｅ roe")[0] == "Person:jane roe"  # NFKC: full-width


def test_participant_names_need_two_capitalised_words_unless_something_came_off() -> None:
    assert looks_like_person_name("Jane Roe")
    assert looks_like_person_name("Dr. Roe")  # an honorific came off
    assert looks_like_person_name("Roe (Finance)")  # an affiliation came off
    assert not looks_like_person_name("Jane")
    assert not looks_like_person_name("jane roe")
    assert not looks_like_person_name("Jane R")
    assert looks_like_person_name("Jo Li")  # two letters a word are enough
    assert not looks_like_person_name("Industrial Designer")
    assert not looks_like_person_name("User Interface")
    assert not looks_like_person_name("Marketing")
    assert looks_like_person_name("Ann Lee Smith")


@pytest.mark.parametrize(("a", "b"), [
    ("+1 (555) 010-0100", "555.010.0100"),  # a country code drops out
    ("+44 20 7946 0958", "020 7946 0958"),  # so does a trunk 0
    ("+49 30 901820", "030-901820"),  # a short national number, with its code and without
])
def test_two_spellings_of_one_phone_share_a_key(a: str, b: str) -> None:
    assert phone_key(a) == phone_key(b) is not None


def test_a_phone_key_is_the_last_eight_digits_and_none_under_eight() -> None:
    assert phone_key("+1 (555) 010-0100") == "50100100"
    assert phone_key("+44 20 7946 0958") == "79460958"
    assert phone_key("ext. 1234567") is None
    assert phone_key("555-01001") == "55501001"
    assert phone_key("+1 555 010 0101") != phone_key("+1 555 010 0100")


def test_the_phones_written_in_a_text() -> None:
    text = ("Call 020-7946-0958 or +1 (555) 010-0100; the meeting is on 2026-12-06 in room "
            "12, ticket 4417.")
    assert phones_in(text) == {"79460958", "50100100", "20261206"}  # a date looks like one


@pytest.mark.parametrize(("a", "b", "kind"), [
    ("P. Raman", "Priya Raman", "initial"),
    ("p raman", "Priya K. Raman", "initial"),  # a middle initial between
    ("Bob Smith", "Robert Smith", "nickname"),
    ("BILL JONES", "William Jones", "nickname"),
    ("Priya Raman", "P. Raman", None),  # one way only: the longer is no variant of the shorter
    ("Robert Smith", "Bob Smith", None),
    ("Bob Smith", "Robert Smyth", None),  # another family name
    ("Bob Smith", "Roberta Smith", None),  # not a nickname of hers
    ("Q. Raman", "Priya Raman", None),
    ("Raman", "Priya Raman", None),  # a surname alone (a document's own rule: its surnames)
    ("Priya Raman", "Priya Raman", None),  # the same name joins by its key, not as a variant
])
def test_a_shorter_spelling_of_a_name(a: str, b: str, kind: str | None) -> None:
    assert variant_of(a, b) == kind
