"""`gcp image build`'s plan, labels and refusals, without a project (the build itself runs
against the wire fakes in tests/integration/test_image_build.py)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from blocks.node_serve import NodeServeSettings
from tasks.gcp.code import Checkout
from tasks.gcp.image import STEPS, BuildOptions, ImageBuild, _label, image_build, labels
from tasks.gcp.reconcile import GcpError
from tasks.gcp.spec import GcpSpec

SPEC = GcpSpec(project="acme-ml", zones=["us-central1-a"], bucket="acme-slm")
CHECKOUT = Checkout("acme-slm", ("Makefile", "pyproject.toml"), b"a tar.gz")  # code.py pack


def _build(**kw: object) -> ImageBuild:
    args: dict[str, object] = dict(checkout=CHECKOUT,
                                   model="allenai/Olmo-3-32B-Think@abc123", image="slm-node-x")
    args.update(kw)
    return image_build(SPEC, NodeServeSettings(), "allenai/Olmo-3-7B-Think@def456",
                       "/opt/models/olmo-3-7b-think-f16.gguf",
                       BuildOptions(**args))  # type: ignore[arg-type]


def test_label_values_are_what_compute_accepts() -> None:
    # [a-z0-9_-], at most 63 characters (cloud.google.com/compute/docs/labeling-resources)
    assert _label("0.3.36") == "0-3-36"
    assert _label("12.8") == "12-8"
    assert _label("Ab_C d") == "ab_c-d"
    assert _label("x" * 70) == "x" * 63


def test_labels_take_the_builders_attributes() -> None:
    attrs = {"code": "4f2a9c1e7b3d5a6f", "cuda": "12.8", "sha256": "a" * 64 + " " + "b" * 64}
    assert labels(attrs, "0.3.36") == {
        "made-by": "slm-nightly", "code": "4f2a9c1e7b3d5a6f", "llama-cpp-python": "0-3-36",
        "cuda": "12-8", "model-sha256": "a" * 16, "base-sha256": "b" * 16}


def script_lines(b: ImageBuild) -> list[str]:
    """The builder's startup script, line by line without indentation."""
    return [ln.strip() for ln in b.script().splitlines()]


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
    assert 'STEPS=(packages nvcc checkout install cached download convert quantize publish ' \
        'weights checks seal)' in script
    # the bucket's folder for these pins: a digest of what the conversion depends on
    assert b.weights == "weights/" + hashlib.sha256("\n".join([
        "allenai/Olmo-3-32B-Think@abc123", "allenai/Olmo-3-7B-Think@def456", "Q3_K_M",
        "/opt/models/Olmo-3-32B-Think-Q3_K_M.gguf", b.tokenizer, b.base_gguf, b.pin]).encode()
    ).hexdigest()[:16]
    assert f"WEIGHTS_URL=https://storage.googleapis.com/storage/v1/b/acme-slm/o/$(printf %s " \
        f"'{b.weights}/'" in script
    assert "\"$SCRATCH/src/Olmo-3-32B-Think-Q3_K_M.gguf\" Q3_K_M" in script


def test_the_estimates_are_the_steps_sum() -> None:
    b = _build()
    minutes = 2 + 0 + 1 + 33 + 0 + 20 + 30 + 20 + 10 + 10 + 3 + 1
    assert sum(m for _, m, _ in STEPS) == minutes == 130
    assert b.hours() == pytest.approx(130 / 60)
    # n2-standard-8 $0.3885/h; 350 GB of pd-balanced at $0.10 per GB-month of 730 h; 85 GB
    # through Cloud NAT at $0.045 a GB
    assert b.cost_usd() == pytest.approx(130 / 60 * (0.3885 + 350 * 0.10 / 730) + 85 * 0.045)
    plan = b.plan()
    assert plan[-1].startswith("estimate: ~2.2 h, ~$4.77 for the build, then ~$5.00/month")
    assert len([ln for ln in plan if ln.startswith("  step ")]) == 12


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
            image_build(SPEC, NodeServeSettings(), base, gguf,
                        BuildOptions(checkout=CHECKOUT, model="allenai/Olmo-3-32B-Think"))


def test_a_model_path_without_a_type_in_its_name_is_refused() -> None:
    node = NodeServeSettings(model_path="/opt/models/olmo.gguf")
    b = image_build(SPEC, node, "allenai/Olmo-3-7B-Think@main", "/opt/b.gguf",
                    BuildOptions(checkout=CHECKOUT, model="allenai/Olmo-3-32B-Think"))
    with pytest.raises(GcpError, match=r"model_path /opt/models/olmo.gguf: no quantization "
                       r"type in its name \(…-Q3_K_M.gguf\)"):
        _ = b.quant


def test_the_plan_says_what_is_made_where_and_for_how_long() -> None:
    plan = _build(max_run_hours=3).plan()
    assert plan[0] == (
        "instances.insert slm-image-builder in us-central1-a: n2-standard-8 (no GPU), "
        "common-cu129-ubuntu-2204-nvidia-580, boot disk 100 GB pd-balanced (the image; each "
        "node's disk), scratch disk 250 GB pd-balanced (peak ~160 GB, deleted with the builder), no external "
        "address, as slm-node@acme-ml.iam.gserviceaccount.com, guest attributes on, at most "
        "3 h then deleted by Compute")
    assert plan[1] == (
        "  its startup script: the checkout gs://acme-slm/code/checkout-"
        f"{CHECKOUT.version}.tar.gz (2 files, 0.0 MB) into /opt/slm-nightly; "
        "allenai/Olmo-3-32B-Think@abc123 → /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf (Q3_K_M); "
        "allenai/Olmo-3-7B-Think@def456 → /opt/slm-hf and /opt/models/olmo-3-7b-think-f16.gguf;"
        " `make install LLAMA_VARIANT=cuda` (llama-cpp-python 0.3.36 for CUDA, architecture 89)")
    weights = _build().weights
    assert plan[2] == (
        f"  the converted weights from gs://acme-slm/{weights}/ where an earlier build of these "
        "pins published them (download, convert, quantize and publish skipped), else made "
        "from the hub and published there")
    assert plan[3] == "  step 1/12 packages: ~2 min (scratch ~0 GB after)"
    assert plan[9] == "  step 7/12 convert: ~30 min (scratch ~95 GB after)"
    assert plan[15:18] == [
        "images.insert slm-node-x in family slm-node from the boot disk (100 GB), labels "
        "code, llama-cpp-python, cuda, model-sha256, base-sha256; the family's other images "
        "are kept",
        "instances.stop slm-image-builder once it reports done; instances.delete "
        "slm-image-builder (both disks with it)",
        "estimate: ~2.2 h, ~$4.77 for the build, then ~$5.00/month for the image at most "
        "(list prices, us-central1; none of it measured)"]


def test_labels_of_a_builder_that_wrote_nothing_are_still_valid() -> None:
    assert labels({}, "0.3.36") == {
        "made-by": "slm-nightly", "code": "", "llama-cpp-python": "0-3-36", "cuda": "",
        "model-sha256": "-", "base-sha256": "-"}


def test_the_run_time_bounds_are_inclusive_and_every_setting_lands() -> None:
    assert _build(max_run_hours=1).max_run_hours == 1
    assert _build(max_run_hours=24).max_run_hours == 24
    node = NodeServeSettings(tokenizer="/m/tok", hf_home="/m/hf", project_dir="/srv/slm",
                             service_user="svc")
    b = image_build(SPEC, node, "org/base@r1", "/m/base.gguf",
                    BuildOptions(checkout=CHECKOUT, model="org/model@r2", profile="prod"))
    assert (b.checkout, b.model, b.base, b.tokenizer, b.hf_home, b.base_gguf,
            b.project_dir, b.user, b.profile, b.pin, b.max_run_hours) == (
        CHECKOUT, "org/model@r2", "org/base@r1", "/m/tok", "/m/hf", "/m/base.gguf",
        "/srv/slm", "svc", "prod", "0.3.36", 6)
    assert b.image.startswith("slm-node-") and len(b.image) == len("slm-node-20261204-2030")


def test_the_script_names_each_value_where_the_steps_use_it() -> None:
    """Every value the builder's script is rendered with, in the line that uses it."""
    lines = script_lines(_build())
    for want in (
            "MD=http://metadata.google.internal/computeMetadata/v1/instance",
            "STATE=/var/lib/slm-image-build", "SCRATCH=/mnt/slm-scratch",
            "PROJECT_DIR=/opt/slm-nightly",
            "curl -sS -X PUT -H 'Metadata-Flavor: Google' --data-binary \"$2\" "
            "\"$MD/guest-attributes/slm-build/$1\" \\",
            "dev=/dev/disk/by-id/google-slm-scratch",
            "out=$(/usr/local/cuda/bin/nvcc --version) || fail \"/usr/local/cuda/bin/nvcc "
            "--version failed: the base image projects/deeplearning-platform-release/global/"
            "images/family/common-cu129-ubuntu-2204-nvidia-580 \\",
            "CUDACXX=/usr/local/cuda/bin/nvcc SLM_BUILD_CACHE=\"$SCRATCH/build-cache\" \\",
            "make -C \"$PROJECT_DIR\" install PYTHON=python3.11 LLAMA_VARIANT=cuda",
            "--include 'tokenizer*' --include 'special_tokens_map.json' --include "
            "'chat_template*' \\",
            "id -u slm >/dev/null 2>&1 || useradd --system --create-home --home-dir "
            "/var/lib/slm slm",
            "fetch_code \"$PROJECT_DIR\"",
            f"tar -tzf \"$archive\" > \"$1/.code-files\" && echo {CHECKOUT.version} > "
            "\"$1/.code-version\"",
            "--local-dir \"$SCRATCH/src/Olmo-3-32B-Think\"",
            "\"$VENV/bin/hf\" download allenai/Olmo-3-7B-Think --revision def456 \\",
            "--local-dir \"$SCRATCH/src/Olmo-3-7B-Think\"",
            "--outfile \"$SCRATCH/src/olmo-3-7b-think-f16.gguf\"",
            "\"$SCRATCH/src/Olmo-3-32B-Think-Q3_K_M.gguf\" Q3_K_M",
            "\"$VENV/bin/slm-nightly\" node prepare-weights --profile gcp --source "
            "\"$SCRATCH/src\"",
            "chown -R slm:slm \"$PROJECT_DIR\" /opt/slm-hf",
            "\"$(dirname /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf)/weights-manifest.json\" > "
            "\"$STATE/sha256\"",
            "sleep 3600"):
        assert want in lines, want


def test_a_hub_id_without_a_revision_downloads_main() -> None:
    """`org/name` alone is the hub's default branch: the script asks for `main`, and the repo
    keeps its full name (a revision is what follows the first '@')."""
    b = image_build(SPEC, NodeServeSettings(), "allenai/Olmo-3-7B-Think", "/opt/b.gguf",
                    BuildOptions(checkout=CHECKOUT, model="allenai/Olmo-3-32B-Think"))
    lines = script_lines(b)
    assert ("\"$VENV/bin/hf\" download allenai/Olmo-3-32B-Think --revision main --local-dir "
            "\"$SCRATCH/model-st\"") in lines
    assert "\"$VENV/bin/hf\" download allenai/Olmo-3-7B-Think --revision main \\" in lines


def test_the_served_model_is_downloaded_by_its_repo_and_revision() -> None:
    lines = script_lines(_build())
    assert ("\"$VENV/bin/hf\" download allenai/Olmo-3-32B-Think --revision abc123 --local-dir "
            "\"$SCRATCH/model-st\"") in lines


def test_a_revision_may_hold_slashes() -> None:
    """Hub revisions such as refs/pr/3 contain '/': only the id before the '@' must be
    org/name."""
    b = image_build(SPEC, NodeServeSettings(), "allenai/Olmo-3-7B-Think@refs/pr/3",
                    "/opt/b.gguf", BuildOptions(checkout=CHECKOUT, model="o/m@refs/pr/1"))
    lines = script_lines(b)
    assert "\"$VENV/bin/hf\" download allenai/Olmo-3-7B-Think --revision refs/pr/3 \\" in lines
    assert ("\"$VENV/bin/hf\" download o/m --revision refs/pr/1 --local-dir "
            "\"$SCRATCH/model-st\"") in lines


def test_a_tokenizer_folder_given_with_a_trailing_slash_keeps_its_name() -> None:
    b = replace(_build(), tokenizer="/opt/models/Olmo-3-32B-Think-MLX/")
    lines = script_lines(b)
    assert "--local-dir \"$SCRATCH/src/Olmo-3-32B-Think-MLX\"" in lines


def test_a_training_base_that_is_a_gguf_file_is_refused_with_the_fix() -> None:
    with pytest.raises(GcpError) as e:
        image_build(SPEC, NodeServeSettings(), "models/base.gguf", "/opt/b.gguf",
                    BuildOptions(checkout=CHECKOUT, model="allenai/Olmo-3-32B-Think"))
    assert str(e.value) == (
        "gcp image build: the training base 'models/base.gguf' and its GGUF '/opt/b.gguf': "
        "the recipe's base_model must be a hub id org/name@revision and its base_gguf the "
        "node's path (recipes/production.yaml), or pass --base-model and --base-gguf")
