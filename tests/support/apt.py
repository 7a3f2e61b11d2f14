"""`apt-get` and `dpkg -s` stand-ins for a VM's script: the archive is a list of names, and what
`apt-get install` installs, `dpkg -s` then finds (the next boot skips it, as on a VM).

apt-get is modelled on apt-get(8) and apt's command-line parsing: -o takes KEY=VALUE (else "E:
Option … requires an argument" / "E: Missing an equals sign …"), the operation is update or
install ("E: Invalid operation X"), a package the archive does not have is "E: Unable to locate
package X"; every error exits 100. `dpkg -s PKG` as dpkg-query(1): the status of an installed
package, else "dpkg-query: package 'PKG' is not installed and no information is available",
exit 1.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

UBUNTU_2204 = ("python3.11-venv", "python3.11-dev", "make", "cmake", "g++", "git", "curl",
               "python3-venv")  # the Deep Learning VM's base, what the builder may ask for
DEBIAN_12 = ("python3-venv", "make", "cmake", "g++", "curl", "git")  # the orchestrator's


def write(path: Path, body: str) -> None:
    """A stand-in program: `body` (dedented) as an executable bash script at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


def standins(bin_: Path, calls: Path, archive: tuple[str, ...],
             installed: tuple[str, ...] = ()) -> Path:
    """apt-get and dpkg in `bin_`, each call appended to `calls`; `installed`: what the image
    has already. Returns the file listing what is installed."""
    have = bin_ / "dpkg-installed"
    bin_.mkdir(parents=True, exist_ok=True)
    have.write_text("".join(f"{p}\n" for p in installed))
    rec = f'echo "$(basename "$0") $*" >> {calls}\n'
    write(bin_ / "apt-get", rec + f"""\
        archive=" {' '.join(archive)} "
        op=; pkgs=()
        while [ $# -gt 0 ]; do
          case "$1" in
            -o) case "${{2:-}}" in
                  "") echo "E: Option -o requires an argument." >&2; exit 100 ;;
                  *=*) shift ;;
                  *) echo "E: Missing an equals sign in the -o option: $2" >&2; exit 100 ;;
                esac ;;
            -y|-q|-qq|--yes|--quiet|--no-install-recommends) ;;
            -*) echo "E: Command line option '$1' is not understood" >&2; exit 100 ;;
            *) if [ -z "$op" ]; then op=$1; else pkgs+=("$1"); fi ;;
          esac
          shift
        done
        case "$op" in
          update) exit 0 ;;
          install) for p in "${{pkgs[@]}}"; do
                     case "$archive" in *" $p "*) ;;
                       *) echo "E: Unable to locate package $p" >&2; exit 100 ;; esac
                   done
                   printf '%s\\n' "${{pkgs[@]}}" >> {have} ;;
          *) echo "E: Invalid operation $op" >&2; exit 100 ;;
        esac
        """)
    write(bin_ / "dpkg", f"""\
        [ "$1" = -s ] && [ $# = 2 ] || {{ echo "dpkg: stand-in models -s PKG only" >&2; exit 2; }}
        if grep -qx -- "$2" {have}; then
          printf 'Package: %s\\nStatus: install ok installed\\n' "$2"
        else
          echo "dpkg-query: package '$2' is not installed and no information is available" >&2
          exit 1
        fi
        """)
    return have
