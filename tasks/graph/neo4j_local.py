"""A real Neo4j on this machine: Neo4j Community 5.26 LTS as `org.neo4j.test:neo4j-harness`,
an in-process DBMS run by a small Java main (LocalNeo4j.java beside this file), with Bolt on a
127.0.0.1 port and authentication on. The tests run every graph test on it, and
`slm-nightly graph local-neo4j` gives it to users to try the production store on one machine.

Needs Java 17 and Maven (`java`, `javac`, `mvn` on PATH) the first time: `resolve()` has Maven
download the harness and its dependencies (~240 jars, ~145 MB, ~45 s) and compiles the main,
once per machine, into the build cache (tasks/engine/llama_build.py `cache_root()`, outside any
checkout). The jars are GPL-3 and never enter the repository; the project talks to them over
a socket only. `make run`, the orchestrator and the node image need none of this.

What Community 5.26 cannot show: privileges (it has one user and no roles: GRANT and DENY are
Enterprise), clusters (routing to followers, stale reads between sessions), more than one
user database (the tests share `neo4j` and clear it), and Neo4j 2025.x (it needs Java 21).
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tasks.engine.llama_build import cache_root
from tasks.shared.errors import ConfigError, ServerError, print_result
from tasks.shared.files import locked, sha256_hex
from tasks.shared.processes import free_port, release_port

HARNESS = "org.neo4j.test:neo4j-harness"
VERSION = "5.26.30"  # the last LTS line on Java 17 (Maven Central, 2026-12)
MAIN = Path(__file__).with_name("LocalNeo4j.java")
USER = "neo4j"  # Community's one user
PASSWORD_ENV = "SLM_LOCAL_NEO4J_PASSWORD"  # `graph local-neo4j`'s password (else a new one)
DATABASE = "neo4j"  # its default database
START_TIMEOUT_S = 180.0  # ~10 s quiet, ~25 s beside a busy test suite on 2 cores
# The JVM: a 1 GiB heap unless told (the tests' graphs are small). `lean` (the tests): the
# serial collector and no C2 compiler, which cost a 2-core machine's other work the least but
# write ~3x slower once warm; the bench and `graph local-neo4j` run the JVM's defaults.
JVM_OPTIONS = ("-Xms256m", "-Xmx1g")
LEAN_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss1m")

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>slm-nightly</groupId><artifactId>local-neo4j</artifactId><version>1</version>
  <dependencies><dependency>
    <groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
  </dependency></dependencies>
</project>
"""


def home(root: Path | None = None) -> Path:
    """The cache folder of this harness version and this main: lib/ (jars), classes/."""
    key = sha256_hex(MAIN.read_bytes(), 12)
    return (root or cache_root()) / "neo4j-harness" / f"{VERSION}-{key}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ConfigError(f"local Neo4j: `{name}` not found on PATH — install a Java 17 JDK "
                          "and Maven (Debian: apt install openjdk-17-jdk-headless maven); "
                          "only the tests and `slm-nightly graph local-neo4j` need them")
    return path


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"local Neo4j: {what} failed (exit {proc.returncode}) — check the "
                          f"network to Maven Central and the JDK:\n"
                          f"{(proc.stdout + proc.stderr)[-3000:]}")


def resolve(root: Path | None = None) -> Path:
    """The harness's folder, resolved and compiled once per machine (a build that stops
    half-way leaves nothing: the folder is renamed into place when done)."""
    done = home(root)
    if (done / "classes" / "LocalNeo4j.class").is_file():
        return done
    java, javac, mvn = _tool("java"), _tool("javac"), _tool("mvn")
    done.parent.mkdir(parents=True, exist_ok=True)
    with locked(done.with_name(done.name + ".lock")):
        if (done / "classes" / "LocalNeo4j.class").is_file():
            return done
        partial = done.with_name(f"{done.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            group, artifact = HARNESS.split(":")
            (partial / "pom.xml").write_text(_POM.format(group=group, artifact=artifact,
                                                         version=VERSION))
            _run([mvn, "-q", "-B", "dependency:copy-dependencies",
                  f"-DoutputDirectory={partial / 'lib'}", "-DincludeScope=runtime"],
                 partial, f"resolving {HARNESS}:{VERSION} with Maven")
            _run([javac, "-d", str(partial / "classes"), "-cp", str(partial / "lib" / "*"),
                  str(MAIN)], partial, f"compiling {MAIN.name}")
            _run([java, "-version"], partial, "running java")
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        partial.rename(done)
    return done


@dataclass
class LocalNeo4j:
    """A running harness: `uri` (bolt://127.0.0.1:PORT), `user`, `password`; `stop()` (or
    leaving the `running()` block) closes its stdin, which ends it."""

    uri: str
    password: str
    port: int
    log: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    user: str = USER
    database: str = DATABASE

    def stop(self, timeout: float = 60.0) -> None:
        if self.process.poll() is None:
            if self.process.stdin:
                self.process.stdin.close()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        release_port(self.port)

    def profile_snippet(self) -> str:
        """The profile's [graph] table for this server. The password is this server's own,
        made for it and gone with it; a lasting server's goes into a saved block's Secret
        field (docs/operations.md)."""
        return (f'[graph]\ntype = "neo4j"\nuri = "{self.uri}"\nuser = "{self.user}"\n'
                f'password = "{self.password}"\ndatabase = "{self.database}"\n')


def start(password: str, workdir: Path, settings: dict[str, str] | None = None,
          heap: str | None = None, timeout: float = START_TIMEOUT_S,
          lean: bool = False) -> LocalNeo4j:
    """Start the harness with its data under `workdir` (deleted when it stops) and return once
    Bolt answers. `settings`: Neo4j settings by their config names."""
    folder = resolve()
    port = free_port()
    where = f"127.0.0.1:{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "local-neo4j.log"
    opts = [o for o in (*JVM_OPTIONS, *(LEAN_OPTIONS if lean else ()))
            if not (heap and o.startswith("-Xmx"))]
    if heap:
        opts.append(f"-Xmx{heap}")
    # the advertised address is what a neo4j:// (routing) driver is sent to: the real port,
    # not the default localhost:7687
    conf = {"server.bolt.listen_address": where, "server.bolt.advertised_address": where,
            **(settings or {})}
    cmd = [_tool("java"), *opts, "-cp", f"{folder / 'lib' / '*'}:{folder / 'classes'}",
           "LocalNeo4j", str(workdir), *(f"{k}={v}" for k, v in conf.items())]
    with log.open("ab") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, cwd=workdir)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(password.encode() + b"\n")
    proc.stdin.flush()
    try:
        uri = _bolt_line(proc, timeout, log)
    except BaseException:
        proc.kill()
        proc.wait()
        release_port(port)
        raise
    return LocalNeo4j(uri, password, port, log, proc)


def _bolt_line(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> str:
    """The `BOLT <uri>` line the main prints once the database answers."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                line = proc.stdout.readline().decode(errors="replace").strip()
                if line.startswith("BOLT "):
                    return line[5:].rstrip("/")
                if not line and proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
    tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
    if proc.poll() is not None:
        raise ServerError(f"local Neo4j exited {proc.returncode} before Bolt answered — its "
                          f"log ({log}) ends:\n{tail}")
    raise ServerError(f"local Neo4j: Bolt did not answer within {timeout:.0f} s — its log "
                      f"({log}) ends:\n{tail}")


@contextmanager
def running(password: str, workdir: Path, settings: dict[str, str] | None = None,
            heap: str | None = None, lean: bool = False) -> Iterator[LocalNeo4j]:
    server = start(password, workdir, settings, heap, lean=lean)
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    """`python -m tasks.graph.neo4j_local`: resolve the harness (make test's first step)."""
    if argv:
        print("usage: python -m tasks.graph.neo4j_local (resolves the harness, prints its "
              "folder)", file=sys.stderr)
        return 2
    return print_result(resolve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
