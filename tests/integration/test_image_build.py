"""`slm-nightly gcp image build` against the wire fakes: Google's client library drives the fake
Compute Engine (tests/fakes/compute_engine.py: instances with a scratch disk, guest attributes,
maxRunDuration with DELETE, images.insert from a disk), whose node runtime (tests/fakes/
node_runtime.py) runs the rendered builder script with bash, as google-startup-scripts does.

The builder boots Google's Deep Learning VM family (the driver and nvcc come with it): no
installer, no reboot. What stands in (recording each call to CALLS): nvcc (CUDA 12.9's --version
text), apt-get (apt-get(8)'s operations, options and exit 100), make (modelled on GNU make's
errors; the real `make install` runs from / in tests/integration/test_node_install.py: its venv
here is this project's), slm-nightly (prepare-weights: it refuses a tokenizer folder without
tokenizer.json, as the real one does; tests/integration/test_weights.py runs the real one), the
disk tools (blkid knows a file system once mkfs made one, mount and umount keep a mount
table that each boot clears, with their exit codes), ldd and ldconfig. The final poweroff
is the runtime's. Real: bash, the script line by line from /, as Google's runner starts it;
curl and tar fetching this checkout (packed and uploaded by the command: tasks/gcp/code.py)
from the bucket, through its IAM (tests/fakes/gcs_iam.py), with the metadata server's token for
the builder's account; the `hf` CLI against the fake Hugging Face Hub (tests/fakes/hf_hub.py)
serving a tiny random OLMo 3 (tests/support/olmo3_tiny.py); llama.cpp's convert_hf_to_gguf.py
and quantizer on what it downloaded; curl to the metadata server; the fake's API as the client
library calls it."""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.gcp.code import pack, push
from tasks.gcp.image import BUILDER, BuildOptions, ImageBuild, build_image, image_build
from tasks.gcp.reconcile import GcpError
from tests.support.gcp_world import PROJECT, World, set_up_project, spec_of
from tests.support.image_builder import BuilderNode, builder_node
from tests.support.paths import ROOT

ZONE = "us-central1-a"

@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with set_up_project(tmp_path) as w:
        w.compute.network.add_image("common-cu129-ubuntu-2204-nvidia-580-v20261120",
                                    "common-cu129-ubuntu-2204-nvidia-580", disk_size_gb=50,
                                    project="deeplearning-platform-release")
        yield w


def _build(world: World, **kw: object) -> ImageBuild:
    """The build of this checkout, packed as `gcp image build` packs it."""
    from blocks.node_serve import NodeServeSettings

    spec = spec_of(world.tmp / "p.toml")
    return image_build(spec, NodeServeSettings(),
                       "allenai/Olmo-3-7B-Think@main", "/opt/models/olmo-3-7b-think-f16.gguf",
                       BuildOptions(checkout=pack(ROOT, spec.bucket),
                                    model="allenai/Olmo-3-32B-Think@0123abc",
                                    **{"image": "slm-node-test-1", **kw}))  # type: ignore[arg-type]


@pytest.fixture
def model(olmo3_tiny: dict[str, Any]) -> Path:
    """What the fake hub serves as both repositories: the tiny OLMo 3's HF folder."""
    return Path(olmo3_tiny["hf"])


def _node(world: World, model: Path) -> BuilderNode:
    node = builder_node(world.tmp, PROJECT, model, world.storage.url)
    return node.attach(world.compute)


# What the first full build published under weights/ (name → bytes): the tests about something
# else than making the weights start with them in the bucket, as a second build of the same
# pins finds them (step cached; the first test shows that path), and skip the conversion. Run
# alone, such a test converts them itself.
PUBLISHED: dict[str, bytes] = {}


def _with_weights(world: World) -> None:
    build = _build(world)
    bucket = world.clients().storage.bucket(build.checkout.bucket)
    for name, data in PUBLISHED.items():
        bucket.blob(f"{build.weights}/{name}").upload_from_string(data)


def _calls(tmp: Path) -> list[str]:
    return (tmp / "CALLS").read_text().splitlines()


def test_the_build_runs_every_step_from_root_and_makes_a_labelled_image(world: World,
                                                                      model: Path) -> None:
    node = _node(world, model)
    old = world.compute.network.add_image("slm-node-20261101", "slm-node", disk_size_gb=200,
                                          created=time.time() - 3600)
    said: list[str] = []
    build = _build(world)
    try:
        name = build_image(build, world.clients(), say=said.append, poll_seconds=0.2)
    finally:
        node.close()
    tmp = world.tmp
    version = build.checkout.version
    assert name == "slm-node-test-1"
    calls = _calls(tmp)
    # the step order, each step once; no driver installer, no reboot
    first = [c.split()[0] if not c.startswith(("python ", "hf ", "slm-nightly "))
             else " ".join(c.split()[:3]) for c in calls]
    assert first == [
        "mkfs.ext4", "mount", "apt-get", "apt-get", "nvcc", "ldconfig", "make", "make-env",
        "hf download allenai/Olmo-3-32B-Think", "hf download allenai/Olmo-3-32B-Think",
        "hf download allenai/Olmo-3-7B-Think",
        f"python {tmp}/checkout/.venv/share/slm-nightly/llama.cpp-0.3.36/convert_hf_to_gguf.py "
        f"{tmp}/scratch/model-st", f"python {tmp}/checkout/.venv/share/slm-nightly/"
        f"llama.cpp-0.3.36/convert_hf_to_gguf.py {tmp}/scratch/src/Olmo-3-7B-Think",
        "python -m tasks.image.quantize", "slm-nightly node prepare-weights",
        "slm-nightly node prepare-weights", "ldd", "umount"]
    d = node.dir(ZONE, BUILDER)
    assert not (d / "reboots").exists()
    # the install is the clone's own Makefile, with the CUDA variant and its compiler
    assert f"make -C {tmp}/checkout install PYTHON=python3.11 LLAMA_VARIANT=cuda" in calls
    assert f"make-env CUDACXX={tmp}/cuda/bin/nvcc SLM_BUILD_CACHE={tmp}/scratch/build-cache" \
        in calls
    assert ("apt-get -o DPkg::Lock::Timeout=600 install -y -q python3.11-venv python3.11-dev "
            "make cmake g++ curl") in calls
    assert "hf download allenai/Olmo-3-32B-Think --revision 0123abc --local-dir " \
        f"{tmp}/scratch/model-st" in calls
    # one pattern a --include (huggingface_hub's cli/download.py takes further words as file
    # names and then ignores --include)
    assert "hf download allenai/Olmo-3-32B-Think --revision 0123abc --include tokenizer* " \
        "--include special_tokens_map.json --include chat_template* --local-dir " \
        f"{tmp}/scratch/src/Olmo-3-32B-Think" in calls
    assert "python -m tasks.image.quantize " f"{tmp}/scratch/model-f16.gguf " \
        f"{tmp}/scratch/src/Olmo-3-32B-Think-Q3_K_M.gguf Q3_K_M CUDACXX=" in calls
    assert (d / "etc" / "ld.so.conf.d" / "slm-cuda.conf").read_text() == f"{tmp}/cuda/lib64\n"
    # the real `hf` against the fake hub: the tokenizer files came twice (with the weights, then
    # into the tokenizer folder by their --include patterns), the weights once
    got = [r.rsplit("/", 1)[-1] for r in node.hub.requests
           if r.startswith("GET /allenai/Olmo-3-32B-Think/resolve/")]
    served = sorted(p.name for p in model.iterdir())
    assert served == ["chat_template.jinja", "config.json", "generation_config.json",
                      "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(got) == sorted([*served, "tokenizer.json", "tokenizer_config.json",
                                  "chat_template.jinja"])
    # llama.cpp's own converter and quantizer made what the node serves: OLMo 3 is written as
    # olmo2; the served file is Q3_K_M (LLAMA_FTYPE_MOSTLY_Q3_K_M = 12), the base f16 (1)
    import gguf

    def fields(name: str) -> tuple[object, ...]:
        r = gguf.GGUFReader(tmp / "models" / name)
        return tuple(r.fields[k].contents() for k in ("general.architecture",
                                                     "general.file_type"))
    assert fields("Olmo-3-32B-Think-Q3_K_M.gguf") == ("olmo2", 12)
    assert fields("olmo-3-7b-think-f16.gguf") == ("olmo2", 1)
    # this checkout, uploaded by the command and fetched by the builder's account with curl
    # from the bucket (through its IAM), unpacked whole; nothing cloned
    got_files = sorted(p.relative_to(tmp / "checkout").as_posix()
                       for p in (tmp / "checkout").rglob("*") if p.is_file()
                       and not p.relative_to(tmp / "checkout").as_posix().startswith(".venv/"))
    assert got_files == sorted([*build.checkout.files, ".code-files", ".code-version"])
    assert (tmp / "checkout" / "Makefile").read_bytes() == (ROOT / "Makefile").read_bytes()
    assert (tmp / "checkout" / ".code-version").read_text() == version + "\n"
    fetched = [c for c in world.gcp.calls if c["api"] == "storage" and c["method"] == "GET"
               and "/o/code/checkout-" in c["path"]]
    assert [(c["member"], c["status"]) for c in fetched] == [
        (f"serviceAccount:{spec_of(tmp / 'p.toml').node_email}", 200)]
    assert f"  the checkout {build.checkout.describe()}: uploaded" in said
    # intermediates deleted as the steps went; the checkout given to the service user
    assert not (tmp / "scratch" / "model-f16.gguf").exists()
    assert not (tmp / "scratch" / "src").exists()
    assert f"-R slm:slm {tmp}/checkout {tmp}/hf" in (d / "chown.log").read_text()
    # the image: the builder's boot disk, in the family, labelled; the older image kept
    img = world.clients().compute("ImagesClient").get_from_family(project=PROJECT,
                                                                  family="slm-node")
    model_sha = hashlib.sha256((tmp / "models" / "Olmo-3-32B-Think-Q3_K_M.gguf")
                               .read_bytes()).hexdigest()
    base = hashlib.sha256((tmp / "models" / "olmo-3-7b-think-f16.gguf").read_bytes()).hexdigest()
    assert (img.name, img.disk_size_gb) == ("slm-node-test-1", 100)
    assert dict(img.labels) == {"made-by": "slm-nightly", "code": version,
                                "llama-cpp-python": "0-3-36", "cuda": "12-9",
                                "model-sha256": model_sha[:16], "base-sha256": base[:16]}
    assert model_sha in img.description and base in img.description
    assert img.source_disk.endswith(f"/zones/{ZONE}/disks/{BUILDER}")
    assert (PROJECT, old.name) in world.compute.network.images
    # the builder and both its disks are gone
    assert (ZONE, BUILDER) not in world.compute.instances
    assert not [k for k in world.compute.network.disks if k[1].startswith(BUILDER)]
    assert "  builder: cuda 12.9" in said and f"  builder: code {version}" in said
    assert "  builder: step 12/12 seal" in said
    # what download, convert and quantize made, published by the builder's account, whole
    bucket = world.clients().storage.bucket(build.checkout.bucket)
    published = {b.name.removeprefix(build.weights + "/"): b
                 for b in bucket.list_blobs(prefix=build.weights + "/")}
    sums = dict(reversed(ln.split("  ", 1)) for ln in
                published.pop("SHA256SUMS").download_as_text().splitlines())
    assert sorted(sums) == sorted(published)
    assert {"Olmo-3-32B-Think-Q3_K_M.gguf", "olmo-3-7b-think-f16.gguf",
            "Olmo-3-32B-Think/tokenizer.json", "Olmo-3-7B-Think/model.safetensors"} <= set(sums)
    assert sums["Olmo-3-32B-Think-Q3_K_M.gguf"] == model_sha
    assert all(hashlib.sha256(published[n].download_as_bytes()).hexdigest() == sums[n]
               for n in sums)
    PUBLISHED.update({n: published[n].download_as_bytes() for n in sums})
    PUBLISHED["SHA256SUMS"] = bucket.blob(f"{build.weights}/SHA256SUMS").download_as_bytes()
    node_sa = f"serviceAccount:{spec_of(tmp / 'p.toml').node_email}"
    uploads = [c["status"] for c in world.gcp.calls if c["api"] == "storage" and c["member"]
               == node_sa and c["method"] == "POST" and c["path"].startswith("/upload/")]
    assert uploads == [200] * (len(sums) + 1)  # each file once, then SHA256SUMS

    # a second build of the same pins takes them from the bucket: nothing from the hub, no
    # conversion, the same weights in the image
    again = builder_node(tmp / "again", PROJECT, model, world.storage.url).attach(world.compute)
    try:
        build_image(_build(world, image="slm-node-test-2"), world.clients(), say=said.append,
                    poll_seconds=0.2)
    finally:
        again.close()
    assert again.hub.requests == []
    steps = [c.split()[0] for c in _calls(tmp / "again")]
    assert "hf" not in steps and "python" not in steps, steps
    img = world.clients().compute("ImagesClient").get_from_family(project=PROJECT,
                                                                  family="slm-node")
    assert (img.name, img.labels["model-sha256"], img.labels["base-sha256"]) == (
        "slm-node-test-2", model_sha[:16], base[:16])


def test_a_missing_cuda_library_fails_the_build_naming_it_and_the_builder_is_deleted(
        world: World, model: Path) -> None:
    (world.tmp / "ldd-missing").touch()
    _with_weights(world)
    node = _node(world, model)
    try:
        with pytest.raises(GcpError) as e:
            build_image(_build(world), world.clients(), say=lambda _: None, poll_seconds=0.2)
    finally:
        node.close()
    msg = str(e.value)
    assert "image build failed on slm-image-builder" in msg
    assert "libcublas.so.12 => not found" in msg and "ldconfig" in msg
    assert "step checks: ldd " in msg
    assert (ZONE, BUILDER) not in world.compute.instances
    assert world.compute.network.family_image(PROJECT, "slm-node") is None


def test_a_builder_nobody_finishes_is_deleted_at_its_maximum_run_time(world: World,
                                                                     model: Path) -> None:
    """The install hangs; Compute deletes the builder at maxRunDuration (DELETE), and the
    command says so instead of waiting."""
    world.compute.run_duration_scale = 1 / 1800  # 1 h of maxRunDuration = 2 s
    node = _node(world, model)
    (world.tmp / "standins" / "make").write_text("#!/bin/bash\nsleep 120\n")
    try:
        with pytest.raises(GcpError, match="is gone before it finished"):
            build_image(_build(world, max_run_hours=1), world.clients(), say=lambda _: None,
                        poll_seconds=0.2)
    finally:
        node.close()
    assert (ZONE, BUILDER) not in world.compute.instances
    assert not [k for k in world.compute.network.disks if k[1].startswith(BUILDER)]


def test_dry_run_prints_the_plan_and_a_script_bash_accepts(
        world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.cli import main

    monkeypatch.chdir(ROOT)  # the checkout the command packs
    assert main(["gcp", "image", "build",
                 "--profile", str(world.tmp / "p.toml"), "--name", "slm-node-x",
                 "--base-model", "allenai/Olmo-3-7B-Think@main", "--base-gguf",
                 "/opt/models/olmo-3-7b-think-f16.gguf", "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan, _, script = out.partition("\nthe builder's startup script:\n\n")
    lines = plan.splitlines()
    assert lines[0] == f"gcp image build (dry run): project {PROJECT}, zone {ZONE}"
    assert [ln.split(":")[0].strip() for ln in lines if ln.startswith("  step")] == [
        f"step {i}/12 {s}" for i, s in enumerate(
            ["packages", "nvcc", "checkout", "install", "cached", "download", "convert",
             "quantize", "publish", "weights", "checks", "seal"], 1)]
    assert "boot disk 100 GB" in lines[1] and "at most 6 h then deleted by Compute" in lines[1]
    assert "common-cu129-ubuntu-2204-nvidia-580, boot disk" in lines[1]
    assert lines[-2] == ("instances.stop slm-image-builder once it reports done; "
                         "instances.delete slm-image-builder (both disks with it)")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # Google's image brings the driver: nothing here installs one or reboots
    assert "cuda_installer" not in script and "\nreboot" not in script
    assert 'make -C "$PROJECT_DIR" install PYTHON=python3.11 LLAMA_VARIANT=cuda' in script
    assert (ZONE, BUILDER) not in world.compute.instances
    # the checkout it would fetch is named, and nothing was uploaded
    bucket = spec_of(world.tmp / "p.toml").bucket
    assert f"  its startup script: the checkout gs://{bucket}/code/checkout-" in plan
    assert not [c for c in world.gcp.calls if c["api"] == "storage" and c["method"] == "POST"
                and "checkout-" in str(c["path"]) + str(c["body"])]


def test_a_checkout_folder_the_build_did_not_make_is_never_deleted(world: World,
                                                                   model: Path) -> None:
    """The checkout step deletes its folder to unpack again after an interrupted run: only a
    folder this build started. One that was there before (not a fresh builder) stops the
    build, untouched."""
    keep = world.tmp / "checkout" / "precious.txt"
    keep.parent.mkdir()
    keep.write_text("mine")
    node = _node(world, model)
    try:
        with pytest.raises(GcpError, match=r"step checkout: .*/checkout exists and this build "
                           "did not make it: build on a fresh builder"):
            build_image(_build(world), world.clients(), say=lambda _: None, poll_seconds=0.2)
    finally:
        node.close()
    assert keep.read_text() == "mine"
    assert sorted(p.name for p in keep.parent.iterdir()) == ["precious.txt"]


def test_quantize_writes_the_type_llama_cpp_names_and_refuses_an_unknown_one(
        olmo3_tiny: dict[str, Any], tmp_path: Path) -> None:
    """The builder's quantize step on the tiny OLMo 3's F32 GGUF: llama.cpp's own quantizer
    writes general.file_type 7 (LLAMA_FTYPE_MOSTLY_Q8_0 in llama.h) and Q8_0 tensors, through
    a .part file renamed into place; an unknown type is refused naming llama.cpp's types."""
    import gguf

    from tasks.image.quantize import quantize
    from tasks.shared.errors import ConfigError

    out = tmp_path / "olmo3-tiny-Q8_0.gguf"
    quantize(olmo3_tiny["gguf"], out, "q8_0")
    reader = gguf.GGUFReader(out)
    assert int(reader.fields["general.file_type"].contents()) == 7
    types = {t.tensor_type.name for t in reader.tensors if t.name.endswith("attn_q.weight")}
    assert types == {"Q8_0"}
    assert not (tmp_path / "olmo3-tiny-Q8_0.gguf.part").exists()
    with pytest.raises(ConfigError, match=r"quantization type 'Q3_X': not one of llama.cpp's "
                       r"\(.*Q3_K_M.*\)"):
        quantize(olmo3_tiny["gguf"], tmp_path / "x.gguf", "Q3_X")
    with pytest.raises(ConfigError, match="is not a file — convert the model to a GGUF first"):
        quantize(tmp_path / "missing.gguf", tmp_path / "y.gguf", "Q8_0")


def test_a_finished_builder_nobody_stops_powers_itself_off(
        world: World, monkeypatch: pytest.MonkeyPatch, model: Path) -> None:
    """`done`, then nobody stops it (the command was interrupted): the script powers the VM off
    after LINGER_SECONDS, a guest shutdown Compute records as TERMINATED; the boot disk is kept
    for an image made by hand."""
    from tasks.gcp import image
    from tasks.gcp.image import Builder

    monkeypatch.setattr(image, "LINGER_SECONDS", 1)
    _with_weights(world)
    node = _node(world, model)
    try:
        build = _build(world)
        push(build.checkout, world.clients())
        builder = Builder(build, world.clients(), say=lambda _: None)
        builder.insert()
        deadline = time.monotonic() + 120
        while builder.status() != "TERMINATED" and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        node.close()
    assert builder.status() == "TERMINATED"
    assert builder.attributes()["done"].endswith(f"{build.checkout.version} cuda 12.9")
    ops = [op.op_type for op in world.compute.operations.values() if op.target.name == BUILDER]
    assert ops[-1] == "compute.instances.guestTerminate", ops
    assert (ZONE, BUILDER) in world.compute.network.disks


def test_reads_that_fail_for_a_while_are_read_again_and_the_build_finishes(
        world: World, model: Path) -> None:
    """Finding 7 of issue 50: a 503 on the instance, a reset connection and a 429 on the guest
    attributes while the command follows the builder are read again; the build goes on."""
    _with_weights(world)
    node = _node(world, model)
    world.compute.fail_next("get", 503, "backendError", times=2, kind="instances")
    world.compute.fail_next("getGuestAttributes", 0, times=1)  # the connection reset
    world.compute.fail_next("getGuestAttributes", 429, "rateLimitExceeded", times=1)
    try:
        name = build_image(_build(world), world.clients(), say=lambda _: None, poll_seconds=0.2)
    finally:
        node.close()
    assert name == "slm-node-test-1"
    assert world.compute.faults == []  # every fault was met, and read past
    assert (ZONE, BUILDER) not in world.compute.instances


def test_ctrl_c_leaves_the_builder_working_and_says_how_to_delete_it(world: World,
                                                                    model: Path) -> None:
    """A Ctrl-C while the command follows the builder keeps the builder and its hours of work
    (any other failure deletes it)."""
    node = _node(world, model)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("  builder: step"):
            raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            build_image(_build(world), world.clients(), say=say, poll_seconds=0.2)
        assert (ZONE, BUILDER) in world.compute.instances
        assert said[-1] == (
            f"  interrupted: {BUILDER} goes on and powers off when done, its boot disk kept "
            "(make the image by hand: docs/operator-gcp-appendix.md); delete it with `gcloud "
            f"compute instances delete {BUILDER} --zone={ZONE}`")
    finally:
        from tasks.gcp.image import Builder

        Builder(_build(world), world.clients(), say=lambda _: None).delete()
        node.close()
    assert (ZONE, BUILDER) not in world.compute.instances


def test_a_builder_whose_account_cannot_read_the_bucket_fails_at_the_checkout_naming_it(
        world: World, model: Path) -> None:
    """Without storage.objects.get on the bucket (its objectViewer binding taken away, as an
    operator's hand edit might), Cloud Storage answers 403 and curl -f fails: the build stops
    at its checkout step with the object and the fix, and the builder is deleted."""
    spec = spec_of(world.tmp / "p.toml")
    policy = world.gcp.policies[f"projects/_/buckets/{spec.bucket}"]
    policy.bindings["roles/storage.objectViewer"].discard(f"serviceAccount:{spec.node_email}")
    node = _node(world, model)
    try:
        with pytest.raises(GcpError) as e:
            build_image(_build(world), world.clients(), say=lambda _: None, poll_seconds=0.2)
    finally:
        node.close()
    msg = str(e.value)
    assert "step checkout: " in msg
    assert f"could not download gs://{spec.bucket}/code/checkout-" in msg
    assert "The requested URL returned error: 403" in msg
    assert (ZONE, BUILDER) not in world.compute.instances
    assert [c.split()[0] for c in _calls(world.tmp)][-2:] == ["nvcc", "ldconfig"]  # no make


def test_weights_in_the_bucket_that_differ_from_their_sums_stop_the_build_naming_the_fix(
        world: World, model: Path) -> None:
    """A folder of weights/ whose file no longer has the sha256 its SHA256SUMS lists (a partial
    or altered upload): the build stops at step cached with sha256sum's own warning and says
    what to delete, before anything reaches the image."""
    build = _build(world)
    bucket = world.clients().storage.bucket(build.checkout.bucket)
    bucket.blob(f"{build.weights}/a.gguf").upload_from_string(b"what was uploaded")
    bucket.blob(f"{build.weights}/SHA256SUMS").upload_from_string(
        hashlib.sha256(b"what was converted").hexdigest() + "  a.gguf\n")
    node = _node(world, model)
    try:
        with pytest.raises(GcpError) as e:
            build_image(build, world.clients(), say=lambda _: None, poll_seconds=0.2)
    finally:
        node.close()
    msg = str(e.value)
    assert "step cached: the weights in gs://" in msg and "delete that folder" in msg
    assert "a.gguf: FAILED" in msg and "WARNING: 1 computed checksum did NOT match" in msg
    assert node.hub.requests == []
    assert world.compute.network.family_image(PROJECT, "slm-node") is None
