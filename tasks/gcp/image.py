"""`gcp image build`: the node image made by one command, on a temporary CPU builder VM.

The builder (n2-standard-8, no GPU: nvcc compiles for the L4 without one) boots Google's Deep
Learning VM image (the profile's [gcp] base_image: the NVIDIA driver and the CUDA toolkit with
nvcc come with it, so the node made from this image has both) with two disks: the boot disk,
which becomes the image (its size is each node's disk size: `gcp nodes` sizes the node from the
image), and a blank scratch disk for the downloads and the intermediate
GGUF, deleted with the builder so they never reach the image. Its startup script
(image_build.sh) runs the steps of STEPS at every boot, skipping those done, so a boot after an
interruption resumes it; it fetches the checkout this command uploaded to the bucket
(tasks/gcp/code.py) and its install step is the checkout's own `make install` with the CUDA
variant (the Makefile), the same steps as on every clone. It reports each step, and any failure
with the log's last lines, in the guest attributes `slm-build/*`.

This command waits on those attributes and prints them. Once they say `done`, it stops the
builder (the script waits for that, and powers off by itself an hour later if nobody does) and
makes the image from the boot disk in the family (labels: the checkout's version, the
llama-cpp-python pin, the CUDA release, the first 16 hex digits of both GGUFs' sha256; the
whole digests in the description), then deletes the builder and both disks. A failure deletes
the builder too (unless --keep-builder); a builder nobody waits on any more is deleted by
Compute at its maximum run time (scheduling.maxRunDuration with instanceTerminationAction
DELETE: cloud.google.com/compute/docs/instances/limit-vm-runtime). Images already in the family
are never touched: `gcp upgrade` moves the nodes, and deprecating the new image rolls back
(docs/operator-gcp.md §10).

The builder runs as the node's service account (it reads the bucket and writes its logs) and
so cannot delete itself: an instance-delete grant on that account would let every node delete
instances.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.resources import files
from string import Template
from typing import Any

from google.api_core.exceptions import NotFound

from tasks.compute.gce.api_errors import transient
from tasks.engine.llama_build import pin
from tasks.gcp.clients import Clients
from tasks.gcp.code import STORAGE, Checkout, fetch_function, push
from tasks.gcp.network import get_or_none, wait_operation
from tasks.gcp.nodes import DISK_TYPE, FAMILY
from tasks.gcp.reconcile import GcpError, api_call, retry
from tasks.gcp.spec import GcpSpec
from tasks.shared.files import sha256_hex

BUILDER = "slm-image-builder"
MACHINE_TYPE = "n2-standard-8"
IMAGE_GB = 100  # the boot disk, so the image, so each node's disk (peak use ~66 GB, below)
SCRATCH_GB = 250  # peak ~160 GB: the 32B's safetensors and its f16 GGUF side by side
MAX_RUN_HOURS = 6
NS = "slm-build"
STATE = "/var/lib/slm-image-build"
SCRATCH = "/mnt/slm-scratch"
SCRATCH_DEVICE = "slm-scratch"  # /dev/disk/by-id/google-<deviceName>
NVCC = "/usr/local/cuda/bin/nvcc"
POLL_SECONDS = 20.0  # the longest wait between two reads of the builder's progress
# a read of the builder that fails with a 5xx, a 429, a rate limit or a dropped connection is tried
# again for this long before the command gives up (and deletes the builder, with hours of work)
READ_RETRY_SECONDS = 600.0
LINGER_SECONDS = 3600  # after `done`, for the command to stop it; then the script powers off
# (step, minutes, GB on scratch at its end) — ESTIMATES for n2-standard-8 and pd-balanced disks
# (none of this has run on Google Cloud): the 32B is 32.2e9 parameters, 64.5 GB in bf16/f16.
# `cached` takes the weights an earlier build of the same pins published (~10 min for ~47 GB)
# and marks download, convert, quantize and publish done; the minutes here are a first build's.
STEPS: tuple[tuple[str, int, int], ...] = (
    ("packages", 2, 0), ("nvcc", 0, 0), ("checkout", 1, 0), ("install", 33, 6),
    ("cached", 0, 0), ("download", 20, 95), ("convert", 30, 95), ("quantize", 20, 47),
    ("publish", 10, 47), ("weights", 10, 1), ("checks", 3, 1), ("seal", 1, 1))
SCRATCH_PEAK_GB = 160  # during convert: safetensors 64.5 + f16 GGUF 64.5 + the 7B's 14.6 x 2
# us-central1 list prices (cloud.google.com/compute/all-pricing, 2026): assumed, not read
USD_PER_HOUR = {"n2-standard-8": 0.3885}
USD_PER_GB_MONTH = {"pd-balanced": 0.10, "image": 0.05}
# the downloads come through Cloud NAT, which bills the data it processes
# (cloud.google.com/nat/pricing): the 32B's safetensors, the 7B's, the wheels and packages
NAT_USD_PER_GB, DOWNLOAD_GB = 0.045, 85
QUANT = re.compile(r"-(Q\d_K_[SML]|Q\d_K|Q\d_\d|Q8_0|F16|BF16)\.gguf$", re.IGNORECASE)


class _Template(Template):
    delimiter = "@"


@dataclass(frozen=True)
class ImageBuild:
    """What one `gcp image build` makes, from the profile and the options."""

    project: str
    zone: str
    subnet_url: str
    node_email: str
    checkout: Checkout  # the code the builder installs (tasks/gcp/code.py)
    model: str  # org/name@revision of the served model's safetensors
    base: str  # org/name@revision of the training base (the recipe's base_model)
    model_path: str
    tokenizer: str
    hf_home: str
    base_gguf: str
    project_dir: str = "/opt/slm-nightly"
    user: str = "slm"
    profile: str = "gcp"
    pin: str = ""  # llama-cpp-python's version (pyproject.toml)
    base_image: str = ""  # the builder's boot image: the profile's [gcp] base_image
    variant: str = "cuda"  # llama.cpp's build (the Makefile's LLAMA_VARIANT)
    max_run_hours: int = MAX_RUN_HOURS
    image: str = field(default_factory=lambda: "slm-node-" + datetime.now(UTC).strftime(
        "%Y%m%d-%H%M"))

    @property
    def weights(self) -> str:
        """Where the bucket keeps what download, convert and quantize make for these pins (the
        two repositories at their revisions, the type, the file names, llama.cpp's converter):
        weights/<16 hex digits of their digest>. A build that finds it takes it from there
        (step cached); one that does not publishes it (step publish)."""
        pins = [self.model, self.base, self.quant, self.model_path, self.tokenizer,
                self.base_gguf, self.pin]
        return "weights/" + sha256_hex("\n".join(pins).encode())[:16]

    @property
    def quant(self) -> str:
        m = QUANT.search(self.model_path)
        if m is None:
            raise GcpError(f"model_path {self.model_path}: no quantization type in its name "
                           "(…-Q3_K_M.gguf): name the file after the type to build")
        return m.group(1).upper()

    def script(self) -> str:
        """The builder's startup script (image_build.sh)."""
        q = shlex.quote
        model_repo, _, model_rev = self.model.partition("@")
        base_repo, _, base_rev = self.base.partition("@")
        text = files("tasks.gcp").joinpath("image_build.sh").read_text()
        return _Template(text).substitute(
            metadata="http://metadata.google.internal/computeMetadata/v1/instance", ns=NS,
            state=STATE, scratch=SCRATCH, scratch_device=SCRATCH_DEVICE,
            project_dir=q(self.project_dir), steps=" ".join(s for s, _, _ in STEPS),
            base_image=q(self.base_image), variant=q(self.variant), nvcc=NVCC,
            user=q(self.user), fetch_code=fetch_function(self.checkout),
            storage=STORAGE, bucket=self.checkout.bucket, weights=self.weights,
            model_repo=q(model_repo), model_revision=q(model_rev or "main"),
            base_repo=q(base_repo), base_revision=q(base_rev or "main"),
            tokenizer_name=q(self.tokenizer.rstrip("/").rsplit("/", 1)[-1]),
            base_name=q(base_repo.rsplit("/", 1)[-1]),
            base_gguf_name=q(self.base_gguf.rsplit("/", 1)[-1]),
            model_name=q(self.model_path.rsplit("/", 1)[-1]), quant=self.quant,
            profile=q(self.profile), hf_home=q(self.hf_home), model_path=q(self.model_path),
            linger=LINGER_SECONDS)

    def hours(self) -> float:
        return sum(m for _, m, _ in STEPS) / 60

    def cost_usd(self) -> float:
        disks = (IMAGE_GB + SCRATCH_GB) * USD_PER_GB_MONTH["pd-balanced"] / 730
        return self.hours() * (USD_PER_HOUR[MACHINE_TYPE] + disks) + NAT_USD_PER_GB * DOWNLOAD_GB

    def plan(self) -> list[str]:
        lines = [
            f"instances.insert {BUILDER} in {self.zone}: {MACHINE_TYPE} (no GPU), "
            f"{self.base_image.rsplit('/', 1)[-1]}, boot disk {IMAGE_GB} GB pd-balanced (the image; "
            f"each node's disk), scratch disk {SCRATCH_GB} GB pd-balanced (peak "
            f"~{SCRATCH_PEAK_GB} GB, deleted with the builder), no external address, as "
            f"{self.node_email}, guest attributes on, at most {self.max_run_hours} h then "
            "deleted by Compute",
            f"  its startup script: the checkout {self.checkout.describe()} into "
            f"{self.project_dir}; "
            f"{self.model} → {self.model_path} ({self.quant}); {self.base} → {self.hf_home} "
            f"and {self.base_gguf}; `make install LLAMA_VARIANT={self.variant}` (llama-cpp-python "
            f"{self.pin} for CUDA, architecture 89)",
            f"  the converted weights from gs://{self.checkout.bucket}/{self.weights}/ where an "
            "earlier build of these pins published them (download, convert, quantize and "
            "publish skipped), else made from the hub and published there",
        ]
        lines += [f"  step {i}/{len(STEPS)} {name}: ~{minutes} min (scratch ~{gb} GB after)"
                  for i, (name, minutes, gb) in enumerate(STEPS, 1)]
        lines += [
            f"images.insert {self.image} in family {FAMILY} from the boot disk ({IMAGE_GB} GB), "
            "labels code, llama-cpp-python, cuda, model-sha256, base-sha256; the family's "
            "other images are kept",
            f"instances.stop {BUILDER} once it reports done; instances.delete {BUILDER} (both "
            "disks with it)",
            f"estimate: ~{self.hours():.1f} h, ~${self.cost_usd():.2f} for the build, then "
            f"~${IMAGE_GB * USD_PER_GB_MONTH['image']:.2f}/month for the image at most "
            "(list prices, us-central1; none of it measured)"]
        return lines


@dataclass(frozen=True)
class BuildOptions:
    """What `gcp image build`'s command line says beside the profile: the checkout the builder
    installs (tasks/gcp/code.py pack), the served model's safetensors (org/name@revision), the
    profile the builder prepares the weights for, the builder's longest run, and the image's
    name (None: slm-node-<UTC time>)."""

    checkout: Checkout
    model: str
    profile: str = "gcp"
    max_run_hours: int = MAX_RUN_HOURS
    image: str | None = None


def image_build(spec: GcpSpec, node: Any, base: str, base_gguf: str | None,
                options: BuildOptions) -> ImageBuild:
    """The build for the profile's node settings (blocks/node_serve.py NodeServeSettings) and
    the training base (the recipe's base_model and base_gguf: tasks/image/cli.py
    layout_from_profile reads the three as `node prepare-weights` does on the builder)."""
    o = options
    gguf = base_gguf or ""
    if base.partition("@")[0].count("/") != 1 or base.endswith(".gguf") or not gguf:
        raise GcpError(f"gcp image build: the training base {base!r} and its GGUF {gguf!r}: "
                       "the recipe's base_model must be a hub id org/name@revision and its "
                       "base_gguf the node's path (recipes/production.yaml), or pass "
                       "--base-model and --base-gguf")
    if not 1 <= o.max_run_hours <= 24:
        raise GcpError(f"--max-run-hours {o.max_run_hours}: between 1 and 24")
    extra = {"image": o.image} if o.image else {}
    return ImageBuild(spec.project, spec.home_zone, spec.subnet_url, spec.node_email,
                      o.checkout, o.model, base, node.model_path, node.tokenizer, node.hf_home, gguf,
                      node.project_dir, node.service_user, o.profile, pin(), spec.base_image,
                      max_run_hours=o.max_run_hours, **extra)


# --- the build ---------------------------------------------------------------------------------
def _label(value: str) -> str:
    """A label value: lowercase letters, digits, '-' and '_', at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def digests(attrs: dict[str, str]) -> tuple[str, str]:
    """(the served model's sha256, the base GGUF's) as the builder's `sha256` attribute says
    them ("-" for one it could not read)."""
    model, _, base = attrs.get("sha256", "- -").partition(" ")
    return model, base


def labels(attrs: dict[str, str], pin: str) -> dict[str, str]:
    model, base = digests(attrs)
    return {"made-by": "slm-nightly", "code": _label(attrs.get("code", "")),
            "llama-cpp-python": _label(pin), "cuda": _label(attrs.get("cuda", "")),
            "model-sha256": _label(model[:16]), "base-sha256": _label(base[:16])}


def _read(fn: Callable[[], Any]) -> Any:
    return retry(BUILDER, fn, retry_on=transient, seconds=READ_RETRY_SECONDS)


class Builder:
    """The builder VM and the image, through Google's client library."""

    def __init__(self, build: ImageBuild, clients: Clients,
                 say: Callable[[str], None] = print, poll_seconds: float = POLL_SECONDS) -> None:
        self.b, self.clients, self.say, self.poll = build, clients, say, poll_seconds

    def _vms(self) -> Any:
        return self.clients.compute("InstancesClient")

    def _wait(self, op: Any, what: str) -> None:
        wait_operation(self.clients, self.b.project, what, op,
                       zone=self.b.zone if getattr(op, "zone", "") else None)

    def insert(self) -> None:
        from google.cloud import compute_v1

        b = self.b
        params = compute_v1.AttachedDiskInitializeParams
        body = compute_v1.Instance(
            name=BUILDER, machine_type=f"zones/{b.zone}/machineTypes/{MACHINE_TYPE}",
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=params(
                       source_image=b.base_image, disk_size_gb=IMAGE_GB,
                       disk_type=f"zones/{b.zone}/diskTypes/{DISK_TYPE}")),
                   compute_v1.AttachedDisk(boot=False, auto_delete=True,
                                           device_name=SCRATCH_DEVICE, initialize_params=params(
                       disk_name=f"{BUILDER}-scratch", disk_size_gb=SCRATCH_GB,
                       disk_type=f"zones/{b.zone}/diskTypes/{DISK_TYPE}"))],
            network_interfaces=[compute_v1.NetworkInterface(subnetwork=b.subnet_url)],
            service_accounts=[compute_v1.ServiceAccount(
                email=b.node_email, scopes=["https://www.googleapis.com/auth/cloud-platform"])],
            scheduling=compute_v1.Scheduling(
                provisioning_model="STANDARD", instance_termination_action="DELETE",
                max_run_duration=compute_v1.Duration(seconds=b.max_run_hours * 3600)),
            metadata=compute_v1.Metadata(items=[
                compute_v1.Items(key="startup-script", value=b.script()),
                compute_v1.Items(key="enable-guest-attributes", value="TRUE")]),
            labels={"made-by": "slm-nightly"})
        op = api_call(f"{BUILDER}: insert", lambda: self._vms().insert_unary(
            project=b.project, zone=b.zone, instance_resource=body),
            fix=f"a builder left by an earlier run: `gcloud compute instances delete {BUILDER} "
            f"--zone={b.zone}`")
        self._wait(op, BUILDER)

    def status(self) -> str | None:
        vm = get_or_none(BUILDER, lambda: _read(lambda: self._vms().get(
            project=self.b.project, zone=self.b.zone, instance=BUILDER)))
        return None if vm is None else str(vm.status)

    def attributes(self) -> dict[str, str]:
        from google.cloud import compute_v1

        request = compute_v1.GetGuestAttributesInstanceRequest(
            project=self.b.project, zone=self.b.zone, instance=BUILDER, query_path=f"{NS}/")
        try:
            got = _read(lambda: self._vms().get_guest_attributes(request=request))
        except NotFound:
            return {}  # nothing written yet
        return {i.key: i.value for i in got.query_value.items if i.namespace == NS}

    def follow(self, deadline: float) -> dict[str, str]:
        """Print each new step until `done` (the attributes) or an error (GcpError)."""
        shown: set[str] = set()
        delay = 1.0  # quick while steps change, then backing off to `poll` seconds
        while True:
            state = self.status()
            attrs = self.attributes() if state == "RUNNING" else {}
            for key in ("boots", "step", "cuda", "code"):
                line = f"{key} {attrs[key].rsplit(' ', 1)[0] if key == 'step' else attrs[key]}" \
                    if key in attrs else None
                if line and line not in shown:
                    shown.add(line)
                    self.say(f"  builder: {line}")
                    delay = 1.0
            if "error" in attrs:
                said = attrs["error"].split(" ", 1)[-1]  # after the time it was written
                raise GcpError(f"image build failed on {BUILDER}: {said} — the whole "
                               f"log: `gcloud compute ssh {BUILDER} --zone={self.b.zone} "
                               f"--tunnel-through-iap -- sudo cat {STATE}/log` (--keep-builder "
                               "keeps it for that)")
            if "done" in attrs:
                return attrs
            if state is None:
                raise GcpError(f"{BUILDER} is gone before it finished (deleted by its maximum "
                               f"run time of {self.b.max_run_hours} h, or by someone): run "
                               "`slm-nightly gcp image build` again")
            if state != "RUNNING" and state not in ("PROVISIONING", "STAGING"):
                raise GcpError(f"{BUILDER} is {state} before it finished (no `done` guest "
                               "attribute): someone stopped it, or its script powered off early")
            if time.monotonic() > deadline:
                raise GcpError(f"{BUILDER}: not done after {self.b.max_run_hours} h")
            time.sleep(min(delay, self.poll))
            delay *= 2

    def stop(self, deadline: float) -> None:
        """instances.stop (the script waits for it: reading `done` and the stop never race),
        then wait until it is TERMINATED."""
        b = self.b
        op = api_call(f"{BUILDER}: stop", lambda: self._vms().stop_unary(
            project=b.project, zone=b.zone, instance=BUILDER))
        self._wait(op, BUILDER)
        while (state := self.status()) != "TERMINATED":
            if state is None:
                raise GcpError(f"{BUILDER} is gone before its disk became an image")
            if time.monotonic() > deadline:
                raise GcpError(f"{BUILDER} is {state}, not stopped, 10 min after its stop")
            time.sleep(min(self.poll, 5.0))

    def make_image(self, attrs: dict[str, str]) -> None:
        from google.cloud import compute_v1

        b = self.b
        model, base = digests(attrs)
        body = compute_v1.Image(
            name=b.image, family=FAMILY,
            source_disk=f"projects/{b.project}/zones/{b.zone}/disks/{BUILDER}",
            labels=labels(attrs, b.pin),
            description=(f"slm-nightly node: checkout {attrs.get('code', '?')}, "
                         f"llama-cpp-python {b.pin}, CUDA {attrs.get('cuda', '?')}; "
                         f"{b.model_path} sha256 {model}; {b.base_gguf} sha256 {base}"))
        op = api_call(f"image {b.image}: insert", lambda: self.clients.compute(
            "ImagesClient").insert_unary(project=b.project, image_resource=body))
        self._wait(op, f"image {b.image}")

    def delete(self) -> None:
        b = self.b
        if self.status() is None:
            return
        op = api_call(f"{BUILDER}: delete", lambda: self._vms().delete_unary(
            project=b.project, zone=b.zone, instance=BUILDER))
        self._wait(op, BUILDER)


def build_image(build: ImageBuild, clients: Clients, *, keep_builder: bool = False,
                say: Callable[[str], None] = print, poll_seconds: float = POLL_SECONDS) -> str:
    """Run the build (module docstring); the image's name."""
    builder = Builder(build, clients, say, poll_seconds)
    say(f"gcp image build: {BUILDER} in {build.zone} → {build.image} (family {FAMILY})")
    uploaded = push(build.checkout, clients)
    say(f"  the checkout {build.checkout.describe()}: {'uploaded' if uploaded else 'there'}")
    builder.insert()
    t0 = time.monotonic()
    try:
        attrs = builder.follow(t0 + build.max_run_hours * 3600)
        builder.stop(time.monotonic() + 600)
        say(f"  builder done after {(time.monotonic() - t0) / 60:.0f} min; making the image")
        builder.make_image(attrs)
    except KeyboardInterrupt:
        # the builder goes on without us: hours of work are not deleted by a Ctrl-C
        say(f"  interrupted: {BUILDER} goes on and powers off when done, its boot disk kept "
            f"(make the image by hand: docs/operator-gcp-appendix.md); delete it with `gcloud "
            f"compute instances delete {BUILDER} --zone={build.zone}`")
        raise
    except BaseException:
        if keep_builder:
            say(f"  kept {BUILDER} (--keep-builder): delete it with `gcloud compute instances "
                f"delete {BUILDER} --zone={build.zone}`")
        else:
            builder.delete()
        raise
    builder.delete()
    say(f"image {build.image} in family {FAMILY}: labels {labels(attrs, build.pin)}")
    return build.image
