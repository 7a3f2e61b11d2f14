"""The baseline gate: a new result against a saved one of the same model and split.

It fails when type-strict entity F1, relationship F1 or grounded precision drops by more than
the tolerance (absolute); anything better, or worse within the tolerance, passes. A figure the
baseline has but the new result has not (null: nothing to rest on) counts as a drop; one the
baseline has not (null) holds nothing back. Recall is gated too: a split of recall-only cases
(the QMSum chunks) has no precision, so no F1, and recall is then what it can say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.evaluation.runner import FORMAT
from tasks.shared.errors import ConfigError

DEFAULT_TOLERANCE = 0.02
GATED = (("entity F1 (type-strict)", ("entities", "type_strict", "f1")),
         ("entity recall (type-strict)", ("entities", "type_strict", "recall")),
         ("relationship F1", ("relationships", "f1")),
         ("relationship recall", ("relationships", "recall")),
         ("grounded precision", ("grounded", "precision")))


def _get(figures: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = figures
    for k in path:
        value = value.get(k) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None


def load_baseline(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"baseline {path}: cannot be read as JSON ({e}) — pass a file "
                          "`slm-nightly eval extraction --out` wrote") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"baseline {path}: not an extraction eval result (no \"format\": "
                          f"\"{FORMAT}\") — pass a file `slm-nightly eval extraction` wrote")
    return data


def check_comparable(baseline: dict[str, Any], result: dict[str, Any], path: Path) -> None:
    """ConfigError when the baseline is of another model or split: its figures say nothing
    about this change."""
    b, r = baseline.get("split"), result.get("split")
    if b != r:
        raise ConfigError(f"baseline {path} is of split {b!r}, this run of split {r!r}: the "
                          f"gate compares one split with itself — pass a baseline of split "
                          f"{r!r}, or run with --split {b}")
    b, r = baseline.get("model"), result.get("model")
    if b != r:
        raise ConfigError(f"baseline {path} is of model {b!r}, this run of model {r!r}: a "
                          f"baseline holds for one model only — make one for {r!r} with "
                          "--out FILE")


def compare(baseline: dict[str, Any], result: dict[str, Any], tolerance: float
            ) -> list[dict[str, Any]]:
    """One row per gated figure: name, old, new, change, passed."""
    rows = []
    for name, path in GATED:
        old, new = _get(baseline.get("figures", {}), path), _get(result["figures"], path)
        if old is None:
            passed, change = True, None  # nothing to hold the new figure to
        elif new is None:
            passed, change = False, None
        else:
            change = new - old
            passed = change >= -tolerance - 1e-12
        rows.append({"figure": name, "old": old, "new": new, "change": change,
                     "passed": passed})
    return rows
