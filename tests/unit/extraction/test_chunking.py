from tasks.extraction.chunking import CHARS_PER_TOKEN, chunk_text, estimate_tokens, halve


def test_short_text_is_one_chunk() -> None:
    assert chunk_text("hello world", 100) == ["hello world"]


def test_chunks_fit_the_budget_and_overlap() -> None:
    lines = [f"**Speaker {i}:** sentence number {i} about the remote control." for i in range(300)]
    text = "\n".join(lines)
    chunks = chunk_text(text, max_tokens=200, overlap_tokens=30)
    assert len(chunks) > 5
    assert all(estimate_tokens(c) <= 200 for c in chunks)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.splitlines()[-1] == b.splitlines()[0]  # overlap: last line repeated
    for line in lines:  # nothing lost
        assert any(line in c for c in chunks)


def test_one_huge_line_is_cut_at_word_boundaries() -> None:
    text = "word " * 5000
    chunks = chunk_text(text, max_tokens=100)
    assert all(len(c) <= 100 * CHARS_PER_TOKEN for c in chunks)
    assert sum(c.count("word") for c in chunks) == 5000


def test_halve_splits_on_a_line() -> None:
    a, b = halve("line one\nline two\nline three\nline four")
    assert a == "line one\nline two" and b == "line three\nline four"
