"""`gcp image build`'s plan, labels and refusals, without a project (the build itself runs
against the wire fakes in tests/integration/test_image_build.py)."""

from __future__ import annotations

import pytest

from blocks.node_serve import NodeServeSettings
from tasks.gcp.image import STEPS, ImageBuild, _label, image_build, labels
from tasks.gcp.reconcile import GcpError
from tasks.gcp.spec import GcpSpec

SPEC = GcpSpec(project="acme-ml", zones=["us-central1-a"], bucket="acme-slm")


def _build(**kw: object) -> ImageBuild:
    args: dict[str, object] = dict(repo="https://github.com/acme/slm-nightly", ref="v2",
                                   model="allenai/Olmo-3-32B-Think@abc123", image="slm-node-x")
    args.update(kw)
    return image_build(SPEC, NodeServeSettings(), "allenai/Olmo-3-7B-Think@def456",
                       "/opt/models/olmo-3-7b-think-f16.gguf", **args)  # type: ignore[arg-type]


def test_label_values_are_what_compute_accepts() -> None:
    # [a-z0-9_-], at most 63 characters (cloud.google.com/compute/docs/labeling-resources)
    assert _label("0.3.36") == "0-3-36"
    assert _label("12.8") == "12-8"
    assert _label("Ab_C d") == "ab_c-d"
    assert _label("x" * 70) == "x" * 63


def test_labels_take_the_builders_attributes() -> None:
    attrs = {"commit": "4f2a9c1e7b3d5a6f8e0c2b4d6f8a0c2e4b6d8f0a", "cuda": "12.8",
             "sha256": "a" * 64 + " " + "b" * 64}
    assert labels(attrs, "0.3.36") == {
        "made-by": "slm-nightly", "commit": "4f2a9c1e7b3d", "llama-cpp-python": "0-3-36",
        "cuda": "12-8", "model-sha256": "a" * 16, "base-sha256": "b" * 16}


def test_the_build_reads_the_node_settings_and_the_pins() -> None:
    b = _build()
    assert (b.project, b.zone, b.node_email) == (
        "acme-ml", "us-central1-a", "slm-node@acme-ml.iam.gserviceaccount.com")
    assert b.subnet_url.endswith("/regions/us-central1/subnetworks/slm-subnet")
    assert (b.model_path, b.quant, b.project_dir, b.user) == (
        "/opt/models/Olmo-3-32B-Think-Q3_K_M.gguf", "Q3_K_M", "/opt/slm-nightly", "slm")
    script = b.script()
    assert "--revision abc123 --local-dir \"$SCRATCH/model-st\"" in script
    assert "allenai/Olmo-3-7B-Think --revision def456" in script
    assert 'STEPS=(packages driver toolkit nvcc checkout engine project download convert ' \
        'quantize weights checks seal)' in script
    assert "\"$SCRATCH/src/Olmo-3-32B-Think-Q3_K_M.gguf\" Q3_K_M" in script


def test_the_estimates_are_the_steps_sum() -> None:
    b = _build()
    minutes = 3 + 8 + 12 + 0 + 1 + 25 + 8 + 20 + 30 + 20 + 10 + 3 + 1
    assert sum(m for _, m, _ in STEPS) == minutes == 141
    assert b.hours() == pytest.approx(141 / 60)
    # n2-standard-8 $0.3885/h; 350 GB of pd-balanced at $0.10 per GB-month of 730 h
    assert b.cost_usd() == pytest.approx(141 / 60 * (0.3885 + 350 * 0.10 / 730))
    plan = b.plan()
    assert plan[-1].startswith("estimate: ~2.4 h, ~$1.03 for the build, then ~$5.00/month")
    assert len([ln for ln in plan if ln.startswith("  step ")]) == 13


@pytest.mark.parametrize(("kw", "message"), [
    ({"max_run_hours": 0}, "--max-run-hours 0: between 1 and 24"),
    ({"max_run_hours": 25}, "--max-run-hours 25: between 1 and 24"),
])
def test_refusals(kw: dict[str, object], message: str) -> None:
    with pytest.raises(GcpError, match=message):
        _build(**kw)


def test_a_base_that_is_not_a_hub_id_or_no_base_gguf_is_refused() -> None:
    for base, gguf in (("/models/base.gguf", "/opt/b.gguf"), ("allenai", "/opt/b.gguf"),
                       ("allenai/Olmo-3-7B-Think@main", None)):
        with pytest.raises(GcpError, match="pass --base-model and --base-gguf"):
            image_build(SPEC, NodeServeSettings(), base, gguf, repo="r", ref="main",
                        model="allenai/Olmo-3-32B-Think")


def test_a_model_path_without_a_type_in_its_name_is_refused() -> None:
    node = NodeServeSettings(model_path="/opt/models/olmo.gguf")
    b = image_build(SPEC, node, "allenai/Olmo-3-7B-Think@main", "/opt/b.gguf", repo="r",
                    ref="main", model="allenai/Olmo-3-32B-Think")
    with pytest.raises(GcpError, match=r"model_path /opt/models/olmo.gguf: no quantization "
                       r"type in its name \(…-Q3_K_M.gguf\)"):
        _ = b.quant
