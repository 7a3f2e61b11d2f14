"""The graph's rows (tasks/graph/store.py) refuse what no store could hold."""

from __future__ import annotations

import pytest

from tasks.graph.store import ChunkRow


def test_a_chunk_id_is_its_document_and_index() -> None:
    with pytest.raises(ValueError, match="document#index"):
        ChunkRow("a#2", "a", 1, 0, 3, "abc")
    with pytest.raises(ValueError, match="start <= end"):
        ChunkRow("a#1", "a", 1, 5, 3, "")
