"""Copy the QMSum excerpts the gold is built from (a developer tool; never run by the eval).

    .venv/bin/python evals/extraction/copy_qmsum.py --qmsum ../shared/data/qmsum

Each meeting keeps its whole front matter (the `participants:` list is the meeting's speakers,
which the surname gold needs) and the run of speaker turns that build_gold.py cuts into
CHUNKS_PER_MEETING chunks, starting at the line below; nothing else of the meeting is kept.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_gold import CHUNKS_PER_MEETING, QMSUM, chunk_turns  # noqa: E402

# meeting -> (QMSum folder, first turn: 1-based line of the source file). Chosen for runs of
# short turns with many speakers, party labels and title + surname mentions.
MEETINGS: dict[str, tuple[str, int]] = {
    "covid_5": ("train", 182),
    "covid_7": ("train", 307),
    "education_12": ("train", 110),
    "education_15": ("train", 113),
    "covid_2": ("val", 168),
    "covid_6": ("val", 201),
    "education_18": ("val", 52),
    "education_22": ("val", 136),
}


def excerpt(source: Path, first: int) -> tuple[str, int]:
    """The front matter, the heading, and the turns of the chunks; and the last line."""
    lines = source.read_text(encoding="utf-8").splitlines()
    end_fm = lines.index("---", 1)
    heading = next(ln for ln in lines[end_fm:] if ln.startswith("# "))
    window = lines[first - 1:first - 1 + 80]
    chunks = chunk_turns(window)[:CHUNKS_PER_MEETING]
    kept = "\n".join(chunks).splitlines()
    if len(chunks) < CHUNKS_PER_MEETING or window[:len(kept)] != kept:
        raise SystemExit(f"{source}: line {first} does not start {CHUNKS_PER_MEETING} "
                         "contiguous chunks; pick another line")
    text = "\n".join([*lines[:end_fm + 1], "", heading, "", *kept]) + "\n"
    return text, first + len(kept) - 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qmsum", type=Path, required=True, help="../shared/data/qmsum")
    args = ap.parse_args()
    for meeting, (folder, first) in MEETINGS.items():
        src = args.qmsum / "transcripts" / folder / f"{meeting}.md"
        text, last = excerpt(src, first)
        (QMSUM / folder).mkdir(parents=True, exist_ok=True)
        (QMSUM / folder / f"{meeting}.md").write_text(text, encoding="utf-8")
        print(f"{folder}/{meeting}.md: lines {first}-{last} of transcripts/{folder}/{meeting}.md")
    shutil.copyfile(args.qmsum / "LICENSE", QMSUM / "LICENSE")


if __name__ == "__main__":
    main()
