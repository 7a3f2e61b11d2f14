"""`slm-nightly gcp …`: a Google Cloud project set up, checked and torn down from the gcp
profile's [gcp] and [compute] tables, on Google's client libraries (tasks/gcp/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flows.cli.parsing import add_profile, command_group
from tasks.deploy import PRODUCTION, redeploy
from tasks.shared.errors import ConfigError


def _values(args: argparse.Namespace) -> dict[str, bytes]:
    """Secret values from files (NAME=PATH) and stdin (NAME): never from argv."""
    values: dict[str, bytes] = {}
    for item in args.secret_file or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--secret-file {item!r}: write NAME=PATH (the value is the "
                              "file's content, the secret NAME)")
        try:
            values[name] = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"--secret-file {name}: cannot read {path} ({e.strerror})") from None
    if args.secret_stdin:
        if sys.stdin.isatty():
            raise ConfigError(f"--secret-stdin {args.secret_stdin}: pipe the value in (printf "
                              "'%s' \"$KEY\" | slm-nightly gcp setup --secret-stdin NAME)")
        values[args.secret_stdin] = sys.stdin.buffer.read()
    return values


def _gcp(args: argparse.Namespace) -> int:
    from tasks.gcp.clients import Clients
    from tasks.gcp.reconcile import Mode
    from tasks.gcp.setup import ApplyOptions, apply
    from tasks.gcp.spec import spec_from_profile
    from tasks.profile import project_path, read_profile

    path, data = read_profile(args.profile)
    spec = spec_from_profile(path, data)
    state_dir = project_path(str(data.get("state_dir", ".slm-nightly")))
    cmd = args.gcp_command
    if cmd == "orchestrator":
        return _orchestrator(args, spec)
    if cmd == "upgrade":
        return _upgrade(args, spec)
    if cmd == "image":
        return _image(args, spec)
    if cmd == "nodes":
        from tasks.gcp.nodes import node_vms
        from tasks.gcp.reconcile import run

        print(f"gcp nodes{' (dry run)' if args.dry_run else ''}: project {spec.project}, "
              f"zones {', '.join(spec.zones)}")
        out = run(node_vms(spec, Clients(project=spec.project)),
                  "dry-run" if args.dry_run else "setup")
        return 1 if any(o.state == "skipped" for o in out) else 0
    if cmd == "teardown" and not (args.yes or args.dry_run):
        raise ConfigError("gcp teardown deletes the network, the accounts and the secrets of "
                          f"project {spec.project}: pass --yes (or --dry-run to see the list)")
    mode: Mode = "setup" if cmd == "setup" else "check" if cmd == "check" else "teardown"
    if getattr(args, "dry_run", False):
        mode = "teardown-dry-run" if cmd == "teardown" else "dry-run"
    values = _values(args) if cmd == "setup" else {}
    print(f"gcp {cmd}{' (dry run)' if 'dry' in mode else ''}: project {spec.project}, region "
          f"{spec.home_region}")
    result = apply(spec, Clients(project=spec.project), mode, state_dir=Path(state_dir),
                   options=ApplyOptions(values=values,
                                        delete_bucket=getattr(args, "delete_bucket", None)))
    if cmd == "check":
        print("ok" if result.ok else f"{len(result.drifted)} missing or drifted"
              + (", GPU quota short" if any(q.short for q in result.quotas) else "")
              + " — `slm-nightly gcp setup` repairs the rest")
        return 0 if result.ok else 1
    return 0


def _orchestrator(args: argparse.Namespace, spec: Any) -> int:
    from tasks.gcp import orchestrator
    from tasks.gcp.clients import Clients
    from tasks.gcp.code import pack, push
    from tasks.gcp.reconcile import run

    checkout = pack(Path.cwd(), spec.bucket)
    text = orchestrator.script(spec, checkout, cloud_url=args.cloud_url)
    clients = Clients(project=spec.project)
    if not args.dry_run:
        push(checkout, clients)
    if args.print_script:
        print(text, end="")
        return 0
    print(f"gcp orchestrator{' (dry run)' if args.dry_run else ''}: project {spec.project}, "
          f"zone {spec.home_zone}; the checkout {checkout.describe()}")
    vm = orchestrator.OrchestratorVm(spec, clients, text)
    out = run([vm], "dry-run" if args.dry_run else "setup")
    ssh = (f"gcloud compute ssh {spec.orchestrator} --zone={spec.home_zone} "
           "--tunnel-through-iap -- sudo")
    if out[0].state == "created":
        print(f"its first boot installs everything (10–20 min); follow it with `{ssh} journalctl "
              "-fu google-startup-scripts`")
    elif out[0].state == "repaired":
        print(f"outside the night, install it: `{ssh} google_metadata_script_runner startup`")
    return 0


def _image(args: argparse.Namespace, spec: Any) -> int:
    from tasks.gcp.clients import Clients
    from tasks.gcp.code import pack
    from tasks.gcp.image import BuildOptions, build_image, image_build
    from tasks.image.cli import layout_from_profile

    node, base, base_gguf = layout_from_profile(args.profile)
    build = image_build(spec, node, args.base_model or base, args.base_gguf or base_gguf,
                        BuildOptions(checkout=pack(Path.cwd(), spec.bucket), model=args.model,
                                     profile=args.profile, max_run_hours=args.max_run_hours,
                                     image=args.name))
    if args.dry_run:
        print(f"gcp image build (dry run): project {spec.project}, zone {spec.home_zone}")
        for line in build.plan():
            print(line)
        print("\nthe builder's startup script:\n")
        print(build.script(), end="")
        return 0
    build_image(build, Clients(project=spec.project), keep_builder=args.keep_builder)
    return 0


def _upgrade(args: argparse.Namespace, spec: Any) -> int:
    """The nodes onto the family's newest image, then the code redeployed with each schedule
    kept as it was."""
    from tasks.gcp.clients import Clients
    from tasks.gcp.nodes import node_images
    from tasks.gcp.reconcile import run

    print(f"gcp upgrade{' (dry run)' if args.dry_run else ''}: project {spec.project}")
    run(node_images(spec, Clients(project=spec.project)), "dry-run" if args.dry_run else "setup")
    if args.dry_run or args.no_deploy:
        return 0
    from tasks.preflight.prefect_api import api_url_unset

    unset = api_url_unset()
    if unset is not None:
        raise ConfigError(f"gcp upgrade: the nodes are done; the redeploy needs the Prefect "
                          f"API — {unset.detail} — fix: {unset.fix}, then `slm-nightly deploy`")
    for state in redeploy(PRODUCTION):
        print(state.line())
    return 0


def add_gcp(sub: Any) -> None:
    gsub = command_group(sub, "gcp", "set up, check and tear down the Google Cloud project of "
                         "the gcp profile", _gcp)
    setup = gsub.add_parser("setup", help="make what the project lacks and repair what drifted: "
                            "APIs, VPC, subnet, NAT, firewall rules, accounts, grants, bucket, "
                            "secrets, the orchestrator's address; then read the GPU quota "
                            "(idempotent: a second run only reads)")
    setup.add_argument("--dry-run", action="store_true",
                       help="read only: print what each step would do")
    setup.add_argument("--secret-file", action="append", metavar="NAME=PATH",
                       help="a secret's value from a file (repeatable)")
    setup.add_argument("--secret-stdin", metavar="NAME", help="a secret's value from stdin")
    check = gsub.add_parser("check", help="read only: what exists, what is missing, what "
                            "drifted, and the GPU quota (exit 1 unless all is as setup makes it)")
    teardown = gsub.add_parser("teardown", help="delete what setup made (reverse order); the "
                               "bucket only with --delete-bucket NAME; APIs stay on")
    teardown.add_argument("--yes", action="store_true", help="really delete")
    teardown.add_argument("--dry-run", action="store_true", help="print what would go")
    teardown.add_argument("--delete-bucket", metavar="NAME",
                          help="also delete this bucket and everything in it (the profile's "
                          "bucket, named exactly)")
    orch = gsub.add_parser("orchestrator", help="create the orchestrator VM (Debian 12, its "
                           "account, no external address, the static internal address) whose "
                           "startup script installs this checkout (uploaded to the bucket) as "
                           "the service user, the Prefect server with an auth string, and the "
                           "worker; on an existing VM, its startup script replaced when the "
                           "checkout or settings changed; or print that script")
    orch.add_argument("--cloud-url", help="[gcp] prefect = \"cloud\": the workspace's API URL")
    orch.add_argument("--print-script", action="store_true",
                      help="upload the checkout and print the install script (run it with sudo "
                      "bash on a Debian 12 VM whose account reads the bucket)")
    orch.add_argument("--dry-run", action="store_true", help="print what would be created")
    nodes = gsub.add_parser("nodes", help="create the GPU node instances, one per zone (and "
                            "per [compute] nodes), from the newest image of family slm-node, "
                            "with a disk of the image's size; each is stopped once created")
    nodes.add_argument("--dry-run", action="store_true", help="print what would be created")
    upgrade = gsub.add_parser("upgrade", help="move each stopped node onto the newest image "
                              "of family slm-node (made anew: a boot image cannot change in "
                              "place), then redeploy the code with each schedule kept active "
                              "or paused as it was (slm-nightly deploy)")
    upgrade.add_argument("--dry-run", action="store_true", help="print what would change")
    upgrade.add_argument("--no-deploy", action="store_true", help="the nodes only")
    image = gsub.add_parser("image", help="the node image").add_subparsers(
        dest="image_command", required=True, metavar="build")
    build = image.add_parser("build", help="make the node image on a temporary CPU builder "
                             "VM (Google's Deep Learning VM with its driver and CUDA, the "
                             "checkout's make install for the L4, the model files) in family "
                             "slm-node, then delete the builder; the family's other images "
                             "are kept")
    build.add_argument("--model", default="allenai/Olmo-3-32B-Think@main",
                       help="the served model's safetensors, org/name@revision (default "
                       "allenai/Olmo-3-32B-Think@main; pin a commit for a repeatable image)")
    build.add_argument("--base-model", help="override the recipe's base_model (org/name@rev)")
    build.add_argument("--base-gguf", help="override the recipe's base_gguf (the node's path)")
    build.add_argument("--name", help="the image's name (default slm-node-YYYYMMDD-HHMM, UTC)")
    build.add_argument("--max-run-hours", type=int, default=6,
                       help="Compute deletes the builder after this long (default 6)")
    build.add_argument("--keep-builder", action="store_true",
                       help="on a failure, keep the builder to read its log")
    build.add_argument("--dry-run", action="store_true",
                       help="print the plan, the estimates and the builder's script")
    for p in (setup, check, teardown, orch, nodes, upgrade, build):
        add_profile(p, default="gcp")
