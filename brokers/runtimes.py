"""Where each supported RabbitMQ version lives on this machine, and how to install it.

3.10.8 is Debian bookworm's package, installed on the host. 4.0.5 (trixie) and 4.3.6 (sid)
run inside debootstrap chroots under ``CQF_CHROOTS`` (default ``/var/cache/cqforensics/chroots``).

``python -m brokers.runtimes install`` installs whatever is missing (root, apt,
debootstrap); CI runs it before the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CHROOTS = Path(os.environ.get("CQF_CHROOTS", "/var/cache/cqforensics/chroots"))
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def apt_mirror() -> str:
    """The Debian archive apt already uses on this host, read from its sources at run time.

    debootstrap must pull from the same mirror the host's apt is configured for (no registry host is
    written into the project). Both formats are read: one-line ``deb URI suite ...`` and deb822
    ``URIs:`` stanzas; the first URI whose path ends in ``/debian`` (the main archive, not security)
    wins.
    """
    files: list[Path] = []
    for src in APT_SOURCES:
        if src.is_file():
            files.append(src)
        elif src.is_dir():
            files += sorted(p for p in src.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    uris: list[str] = []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("deb "):
                parts = [w for w in line.split()[1:] if not w.startswith("[")]
                uris += parts[:1]
            elif line.startswith("URIs:"):
                uris += line.split()[1:]
    for uri in uris:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    raise SystemExit(f"no Debian archive found in apt's sources ({', '.join(map(str, APT_SOURCES))}); pass --mirror")


@dataclass(frozen=True)
class Runtime:
    """One RabbitMQ version: the filesystem root it runs in and the suite it came from."""

    version: str
    suite: str
    chroot: bool

    @property
    def root(self) -> Path:
        return CHROOTS / self.suite if self.chroot else Path("/")

    @property
    def server_dir(self) -> Path:
        return self.root / "usr/lib/rabbitmq/lib" / f"rabbitmq_server-{self.version}"

    def unavailable(self) -> str | None:
        """Why this version cannot be started here, or None when it can."""
        if self.chroot and os.geteuid() != 0:
            return f"RabbitMQ {self.version} runs in a chroot, which needs root"
        if not self.server_dir.is_dir():
            found = sorted(p.name for p in (self.root / "usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
            where = f"chroot {self.root}" if self.chroot else "the host"
            have = f" (found {', '.join(found)})" if found else ""
            return f"RabbitMQ {self.version} is not installed in {where}{have}; run: python -m brokers.runtimes install"
        return None


RUNTIMES: dict[str, Runtime] = {
    "3.10.8": Runtime("3.10.8", "bookworm", chroot=False),
    "4.0.5": Runtime("4.0.5", "trixie", chroot=True),
    "4.3.6": Runtime("4.3.6", "sid", chroot=True),
}


def runtime(version: str) -> Runtime:
    try:
        return RUNTIMES[version]
    except KeyError:
        raise ValueError(f"unsupported broker version {version!r}; known: {', '.join(RUNTIMES)}") from None


def prepare_chroot(root: Path) -> None:
    """Make a chroot usable for a broker: /proc and /dev mounted, localhost resolvable."""
    mounts = Path("/proc/self/mounts").read_text()
    for sub, args in (("proc", ["-t", "proc", "proc"]), ("dev", ["--bind", "/dev"])):
        target = root / sub
        if f" {target} " not in mounts:
            subprocess.run(["mount", *args, str(target)], check=True)
    hosts = root / "etc/hosts"
    # sid's minbase ships no /etc/hosts; without it epmd cannot resolve 'localhost' and boot hangs.
    if not hosts.exists() or "localhost" not in hosts.read_text():
        hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kw)


def install(versions: list[str] | None = None, mirror: str | None = None) -> None:
    """Install every missing runtime (needs root). Existing chroots are reused."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wanted = [runtime(v) for v in (versions or list(RUNTIMES))]
    if any(not rt.chroot and rt.unavailable() for rt in wanted) or (
        any(rt.chroot and rt.unavailable() for rt in wanted) and not shutil.which("debootstrap")
    ):
        # A policy-rc.d keeps apt from starting the system-wide broker service.
        policy = Path("/usr/sbin/policy-rc.d")
        if not policy.exists():
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
        _run(["apt-get", "update", "-q"], env=env)
        _run(["apt-get", "install", "-y", "-q", "rabbitmq-server", "debootstrap"], env=env)
    procs = []
    mirror = mirror or apt_mirror()
    for rt in wanted:
        if not rt.chroot or rt.server_dir.is_dir():
            continue
        if rt.root.exists():
            shutil.rmtree(rt.root)  # a half-made chroot from an interrupted run
        rt.root.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["debootstrap", "--variant=minbase", "--include=rabbitmq-server", rt.suite, str(rt.root), mirror]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        log = open(rt.root.parent / f"{rt.suite}.debootstrap.log", "w")
        procs.append((rt, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    for rt, proc, log in procs:  # both suites download in parallel
        rc = proc.wait()
        log.close()
        if rc != 0:
            raise SystemExit(f"debootstrap {rt.suite} failed (exit {rc}); see {log.name}")
    for rt in wanted:
        if rt.chroot:
            prepare_chroot(rt.root)
        why = rt.unavailable()
        if why:
            raise SystemExit(why)
        print(f"RabbitMQ {rt.version}: {rt.root}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m brokers.runtimes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_install = sub.add_parser("install", help="install the missing broker runtimes (root)")
    p_install.add_argument("versions", nargs="*", help=f"default: {' '.join(RUNTIMES)}")
    p_install.add_argument(
        "--mirror", default=None, help="Debian archive for debootstrap (default: the one in apt's sources)"
    )
    sub.add_parser("status", help="say which versions can be started here")
    args = parser.parse_args(argv)
    if args.cmd == "install":
        install(args.versions or None, args.mirror)
    else:
        for rt in RUNTIMES.values():
            print(f"{rt.version}: {rt.unavailable() or 'ok (' + str(rt.root) + ')'}")


if __name__ == "__main__":
    main()
