"""Start, stop, kill and restart a real RabbitMQ broker on a data directory of our choosing.

A broker lives in a *run dir*::

    RUN/mnesia/rabbit@localhost/...     RABBITMQ_MNESIA_BASE (the node dir is RUN/mnesia/<node>)
    RUN/log/  RUN/home/  RUN/rabbitmq.conf  RUN/enabled_plugins  [RUN/advanced.config]

It listens on 127.0.0.1 only, with its own AMQP, distribution and epmd ports, so several
brokers (of different versions) can run at once. ``plugins`` enables the protocol plugins the
broker packages ship (``rabbitmq_mqtt``, ``rabbitmq_stomp``, ``rabbitmq_stream``), each on its own
127.0.0.1 port (``mqtt_port``, ``stomp_port``, ``stream_port``; the stream plugin advertises that
address to its clients). A node dir installed with ``install_node`` that a 4.x broker wrote
with the MQTT plugin (its feature-flag file lists the plugin's flags) gets that plugin enabled
too: its ``#mc{mc_mqtt}`` messages can be converted for delivery only when the plugin is loaded. Versions running in a chroot see the run dir
at the same absolute path through a bind mount. When we are root the broker runs as the
``rabbitmq`` user of its root filesystem, as the Debian service script does.

    with Broker("4.3.6", tmp_path / "run") as b:
        b.start(); ...; b.kill(); b.start(); ...; b.stop()

A test that declares queues and then kills the broker calls ``wait_durable`` between the two:
declare-ok does not mean the next boot recovers the queue.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from brokers.runtimes import Runtime, prepare_chroot, runtime
from cqforensics.base.errors import OperationalError
from cqforensics.readers.metadata import read_metadata

NODENAME = "rabbit@localhost"
#: Erlang VM flags: no busy waiting by the schedulers (normal, dirty CPU and dirty I/O)
SCHEDULER_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"
STARTING = 30.0  # seconds a rabbitmqctl command waits for a node finishing its boot

#: protocol plugins the harness knows how to configure (listener setting of each)
PLUGIN_LISTENERS = {
    "rabbitmq_mqtt": "mqtt.listeners.tcp.default",
    "rabbitmq_stomp": "stomp.listeners.tcp.1",
    "rabbitmq_stream": "stream.listeners.tcp.1",
}
#: feature flags that only a node running the plugin enables (rabbit_mqtt_ff, 3.13+); a node dir
#: whose feature-flag file lists one of them was written with the plugin and needs it to deliver
PLUGIN_FEATURE_FLAGS = {"rabbitmq_mqtt": ("mqtt_v5", "rabbit_mqtt_qos0_queue", "delete_ra_cluster_mqtt_node")}


class BrokerError(RuntimeError):
    """The broker could not be started or stopped; the message carries the log tail."""


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (and for a bind to port 0)."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


#: ports this process holds a claim on (``_claim``): port -> the descriptor of its locked file
_CLAIMED: dict[int, int] = {}


def _claim(port: int) -> bool:
    """Claim ``port`` among every process that uses this harness (the xdist workers, a bench
    beside a test run): an exclusive lock on a file named after it in the temp dir, held until
    ``release`` or this process's end (the kernel drops the lock then, so no claim outlives a
    crash). A port free when chosen stays free only until something binds it, and a broker binds
    its ports seconds later, at its boot: two workers choosing the same port in that time made
    one boot fail (``dist_port_already_used``)."""
    if port in _CLAIMED:
        return False
    claims = Path(tempfile.gettempdir()) / "cqf-ports"
    claims.mkdir(mode=0o1777, exist_ok=True)
    fd = os.open(claims / str(port), os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _CLAIMED[port] = fd
    return True


def release(*ports: int) -> None:
    """Give up this process's claim on ``ports`` (``free_port``)."""
    for port in ports:
        fd = _CLAIMED.pop(port, None)
        if fd is not None:
            os.close(fd)


def free_port() -> int:
    """A port free now, outside the ephemeral range, and claimed for this process until
    ``release`` (``_claim``): no other process of the harness is handed it meanwhile. A port bound
    at 0 comes from the ephemeral range, where any outgoing connection (a client's, the broker's
    own) may take it before a later boot of the broker listens on it again (seen: eaddrinuse at a
    restart)."""
    lo, hi = _ephemeral_ports()
    pool = range(10000, lo) if lo > 12000 else range(hi + 1, 65536)
    rng = random.SystemRandom()
    for _ in range(100 if len(pool) else 0):  # a range covering every port above 10000 leaves none
        port = rng.choice(pool)
        if not _claim(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                release(port)
                continue
            return port
    with socket.socket() as s:  # every try taken: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _owner_ids(root: Path) -> tuple[int, int] | None:
    """uid/gid of the 'rabbitmq' user in the passwd file of ``root``."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "rabbitmq":
            return int(fields[2]), int(fields[3])
    return None


class Broker:
    """A RabbitMQ node of ``version`` whose data lives under ``run_dir``."""

    def __init__(
        self,
        version: str,
        run_dir: Path | str,
        *,
        advanced_config: str | None = None,
        nodename: str = NODENAME,
        env: dict[str, str] | None = None,
        plugins=(),
    ):
        self.runtime: Runtime = runtime(version)
        why = self.runtime.unavailable()
        if why:
            raise BrokerError(why)
        self.version = version
        self.run_dir = Path(run_dir).absolute()
        self.nodename = nodename
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.mqtt_port, self.stomp_port, self.stream_port = free_port(), free_port(), free_port()
        unknown = sorted(set(plugins) - set(PLUGIN_LISTENERS))
        if unknown:
            raise BrokerError(f"unsupported plugin(s) {', '.join(unknown)}; known: {', '.join(PLUGIN_LISTENERS)}")
        self.plugins: list[str] = sorted(set(plugins))
        self.extra_env = dict(env or {})
        self._proc: subprocess.Popen | None = None
        self._booted = (0.0, 0.0)  # the last boot's wall and CPU seconds (``CQF_BROKER_CPU_LOG``)
        self._mounted = False
        self._ids = _owner_ids(self.runtime.root) if os.geteuid() == 0 else None
        for sub in ("mnesia", "log", "home"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self._write_config()
        if advanced_config is not None:
            (self.run_dir / "advanced.config").write_text(advanced_config)

    def _write_config(self) -> None:
        """rabbitmq.conf and enabled_plugins (a plugin's settings are valid only when it is enabled)."""
        conf = (
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = info\n"
        )
        ports = self.plugin_ports
        for plugin in self.plugins:
            conf += f"{PLUGIN_LISTENERS[plugin]} = 127.0.0.1:{ports[plugin]}\n"
        if "rabbitmq_stream" in self.plugins:  # a stream client connects to the host and port the broker advertises
            conf += f"stream.advertised_host = 127.0.0.1\nstream.advertised_port = {self.stream_port}\n"
        (self.run_dir / "rabbitmq.conf").write_text(conf)
        (self.run_dir / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")

    @property
    def plugin_ports(self) -> dict[str, int]:
        """The 127.0.0.1 port of each protocol plugin's listener."""
        return {"rabbitmq_mqtt": self.mqtt_port, "rabbitmq_stomp": self.stomp_port, "rabbitmq_stream": self.stream_port}

    def enable_plugins(self, *plugins: str) -> None:
        """Enable more protocol plugins (before ``start``)."""
        if self.running:
            raise BrokerError("stop the broker before changing its plugins")
        unknown = sorted(set(plugins) - set(PLUGIN_LISTENERS))
        if unknown:
            raise BrokerError(f"unsupported plugin(s) {', '.join(unknown)}; known: {', '.join(PLUGIN_LISTENERS)}")
        self.plugins = sorted(set(self.plugins) | set(plugins))
        self._write_config()

    # -- paths ---------------------------------------------------------------------------

    @property
    def mnesia_base(self) -> Path:
        return self.run_dir / "mnesia"

    @property
    def node_dir(self) -> Path:
        return self.mnesia_base / self.nodename

    @property
    def log_file(self) -> Path:
        return self.run_dir / "log" / f"{self.nodename}.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for f in (self.log_file, self.run_dir / "log" / "stdout.txt"):
            if f.exists():
                out += f.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out[-lines:])

    # -- process control -----------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        r = str(self.run_dir)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": f"{r}/home",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "RABBITMQ_MNESIA_BASE": f"{r}/mnesia",
            "RABBITMQ_LOG_BASE": f"{r}/log",
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_CONFIG_FILE": f"{r}/rabbitmq.conf",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{r}/enabled_plugins",
            "RABBITMQ_CONF_ENV_FILE": f"{r}/rabbitmq-env.conf",  # absent: ignore /etc/rabbitmq
            "RABBITMQ_PID_FILE": f"{r}/pid",
            # schedulers that sleep when out of work instead of spinning (RabbitMQ's advice for
            # shared CPUs): a test machine runs brokers beside the tests that feed and read them
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1} " + SCHEDULER_ARGS,
            "ERL_CRASH_DUMP": f"{r}/log/erl_crash.dump",
        }
        if (self.run_dir / "advanced.config").exists():
            env["RABBITMQ_ADVANCED_CONFIG_FILE"] = f"{r}/advanced.config"
        env.update(self.extra_env)
        return env

    def _argv(self, program: str, *args: str) -> list[str]:
        """Command line running a RabbitMQ script inside the runtime, as its rabbitmq user."""
        env = [f"{k}={v}" for k, v in self._env().items()]
        cmd = ["env", "-i", *env, f"/usr/lib/rabbitmq/bin/{program}", *args]
        if self._ids is None:  # not root: run as ourselves on the host
            return cmd
        uid, gid = self._ids
        return ["chroot", f"--userspec={uid}:{gid}", str(self.runtime.root), *cmd]

    def _prepare(self) -> None:
        if self._ids is not None and not self.runtime.chroot:
            # the broker runs as the rabbitmq user: every ancestor of the run dir must let it in
            for parent in self.run_dir.parents:
                if parent.stat().st_mode & 0o001 == 0:
                    raise BrokerError(
                        f"{self.run_dir}: the rabbitmq user cannot enter {parent} "
                        f"(mode {parent.stat().st_mode & 0o777:o}); put broker run dirs elsewhere"
                    )
        if self.runtime.chroot:
            prepare_chroot(self.runtime.root)
            if not self._mounted:
                target = self.runtime.root / str(self.run_dir).lstrip("/")
                target.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "--bind", str(self.run_dir), str(target)], check=True)
                self._mounted = True
        if self._ids is not None:
            uid, gid = self._ids
            os.chown(self.run_dir, uid, gid)
            for dirpath, dirnames, filenames in os.walk(self.run_dir):
                for name in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, name), uid, gid)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 180.0, stuck=None) -> None:
        """Boot the node and wait until its AMQP listener accepts connections.

        Raises BrokerError (with the log tail) when the node exits or is not up within
        ``timeout`` seconds; a node that hangs at boot is killed before raising. ``stuck``: a
        function asked while waiting, returning why the boot can no longer complete (as the
        broker's own state shows it) or None: then it is given up at once, as after ``timeout``.
        """
        if self.running:
            raise BrokerError(f"broker {self.version} on {self.run_dir} is already running")
        self._prepare()
        (self.run_dir / "pid").unlink(missing_ok=True)
        out = open(self.run_dir / "log" / "stdout.txt", "ab")
        self._proc = subprocess.Popen(
            self._argv("rabbitmq-server"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.run_dir,
        )
        out.close()
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                self._proc = None
                raise BrokerError(
                    f"RabbitMQ {self.version} exited at boot (status {rc}) on {self.node_dir}\n" + self.log_tail()
                )
            if self._listening():
                self._booted = (time.monotonic() - started, _session_cpu(self._proc.pid))
                return
            why = stuck() if stuck is not None else None
            if why:
                self.kill()
                raise BrokerError(
                    f"RabbitMQ {self.version} is stuck at boot on {self.node_dir}: {why}\n" + self.log_tail()
                )
            time.sleep(0.25)
        self.kill()
        raise BrokerError(
            f"RabbitMQ {self.version} did not come up within {timeout:.0f}s on {self.node_dir}\n" + self.log_tail()
        )

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                s.settimeout(2)
                if s.recv(1) != b"\x01":  # connection.start frame: the broker is serving
                    return False
        except OSError:
            return False
        ports = self.plugin_ports
        for plugin in self.plugins:  # and every enabled protocol plugin accepts connections
            try:
                socket.create_connection(("127.0.0.1", ports[plugin]), timeout=0.5).close()
            except OSError:
                return False
        return True

    def ctl(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        """Run rabbitmqctl against this node; returns its stdout. The AMQP listener answers a
        moment before the node counts itself booted (its last boot steps), a moment that grows
        on a loaded machine: a command refused for "the 'rabbit' app" not running yet is tried
        again for up to ``STARTING`` seconds."""
        deadline = time.monotonic() + STARTING
        while True:
            proc = subprocess.run(
                self._argv("rabbitmqctl", "-n", self.nodename, *args), capture_output=True, text=True, timeout=timeout
            )
            starting = proc.returncode != 0 and "requires the 'rabbit' app to be running" in proc.stderr + proc.stdout
            if not starting or not self.running or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if check and proc.returncode != 0:
            raise BrokerError(
                f"rabbitmqctl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc.stdout

    def stop(self, timeout: float = 180.0) -> None:
        """Clean shutdown (rabbitmqctl shutdown): the broker writes its clean-shutdown files."""
        if not self.running:
            return
        self._log_cpu("stop")
        try:
            self.ctl("shutdown", timeout=timeout)
            self._proc.wait(timeout=timeout)
        except (BrokerError, subprocess.TimeoutExpired) as e:
            self.kill()
            raise BrokerError(f"clean stop of RabbitMQ {self.version} failed; killed it instead: {e}") from e
        finally:
            self._proc = None

    def wait_durable(self, *queues: str, vhost: str = "/", timeout: float = 30.0) -> None:
        """Wait until the node's metadata files hold the declarations of ``queues`` (of ``vhost``)
        the way its next boot recovers them, so that a kill -9 from now on keeps them.

        Declare-ok comes before that on Mnesia (3.x, 4.0): a declaration is a presume-abort
        transaction whose commit and then outcome are appended to LATEST.LOG through disk_log's
        write cache (flushed up to 2 s later); a kill before the outcome is on file and the next
        boot aborts the declaration. (Khepri, 4.2+, answers once its Ra log holds the command.) Raises
        BrokerError naming the queues still missing when ``timeout`` runs out.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                meta = read_metadata(self.node_dir)
            except OperationalError:  # a log file renamed by Mnesia's log dump while we read: look again
                meta = None
            missing = [q for q in queues if meta is None or meta.knows(vhost.encode(), q.encode()) is not True]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise BrokerError(
                    f"RabbitMQ {self.version}: after {timeout:.0f}s the metadata files of {self.node_dir} "
                    f"still lack the durable declaration of {', '.join(map(repr, missing))} in vhost "
                    f"{vhost!r} (a kill -9 now would lose it)"
                    + (f"; reader notes: {'; '.join(meta.notes)}" if meta and meta.notes else "")
                )
            time.sleep(0.1)

    def _log_cpu(self, end: str) -> None:
        """With ``CQF_BROKER_CPU_LOG`` set, append one line per broker run to that file: version,
        how it ended, the test, the boot's wall and CPU seconds and the run's CPU so far (every
        process of the broker's session), to see what the brokers cost the suite."""
        log = os.environ.get("CQF_BROKER_CPU_LOG")
        if not log or self._proc is None:
            return
        wall, boot = self._booted
        test = os.environ.get("PYTEST_CURRENT_TEST", "-").rsplit(" ", 1)[0]
        with open(log, "a") as f:
            f.write(f"{self.version}\t{end}\t{wall:.2f}\t{boot:.2f}\t{_session_cpu(self._proc.pid):.2f}\t{test}\n")

    def kill(self) -> None:
        """kill -9 the whole broker process group (no clean-shutdown files are written)."""
        if self._proc is None:
            return
        self._log_cpu("kill")
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        self._proc = None

    def close(self) -> None:
        """Kill the node if still running, stop its epmd and release the bind mount. epmd refuses
        to stop while it lists a node ("Killing not allowed - living nodes in database"), and a
        node killed with kill -9 stays listed until its Erlang VM is gone, a moment after the
        process ``kill`` waits for: asked again for up to 10 s (a daemon left running otherwise)."""
        self.kill()
        deadline = time.monotonic() + 10
        while True:
            done = subprocess.run(self._argv_epmd_kill(), capture_output=True, text=True)
            if "not allowed" not in done.stdout + done.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        release(self.port, self.dist_port, self.epmd_port, self.mqtt_port, self.stomp_port, self.stream_port)
        if self._mounted:
            target = self.runtime.root / str(self.run_dir).lstrip("/")
            subprocess.run(["umount", "-l", str(target)], check=False)
            self._mounted = False
            try:
                target.rmdir()
            except OSError:
                pass

    def _argv_epmd_kill(self) -> list[str]:
        epmd = next(iter(sorted((self.runtime.root / "usr/lib/erlang").glob("erts-*/bin/epmd"))), None)
        path = "/" + str(epmd.relative_to(self.runtime.root)) if epmd else "epmd"
        cmd = ["env", "-i", f"ERL_EPMD_PORT={self.epmd_port}", path, "-kill"]
        if self._ids is None:
            return cmd
        uid, gid = self._ids
        return ["chroot", f"--userspec={uid}:{gid}", str(self.runtime.root), *cmd]

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- data ------------------------------------------------------------------------------

    def install_node(self, src_mnesia_base: Path) -> None:
        """Copy a node's mnesia base (``<base>/rabbit@localhost`` plus feature-flag files) in."""
        if self.running:
            raise BrokerError("stop the broker before replacing its data")
        shutil.rmtree(self.mnesia_base, ignore_errors=True)
        shutil.copytree(src_mnesia_base, self.mnesia_base, symlinks=True)
        relocate_ra_configs(self.mnesia_base)
        needed = plugins_needed(self.mnesia_base)
        if not set(needed) <= set(self.plugins):
            self.enable_plugins(*needed)


_RA_DIR_KEY = re.compile(r'((?:wal_)?data_dir\s*=>\s*)"([^"]*)"')


def relocate_ra_configs(mnesia_base: Path) -> list[Path]:
    """Point the Ra server configs of a node dir installed at a new place at that place.

    Ra keeps each server's config in ``<system dir>/<uid>/config`` (an Erlang term, written by
    ``ra_log:write_config/2``) with the system's ``data_dir`` and ``wal_data_dir`` as absolute
    paths. Ra 2.2.0 (RabbitMQ 3.10.8) restarts a server from that stored config as it is
    (``ra_server_sup_sup:restart_server_rpc/3`` merges only the mutable keys), so on a node dir
    moved elsewhere ``ra_log:init/1`` fails to make the old directory (``{error, enoent}``) and
    the stream coordinator (and every quorum queue) never starts. Later Ra versions replace the
    stored system config with the running one. What an operator moving a 3.10 node dir has to do
    too; only the copy the harness installed is changed. Returns the configs rewritten."""
    out = []
    for system in ("coordination", "quorum"):
        for sysdir in Path(mnesia_base).glob(f"*/{system}/*"):
            for cfg in sysdir.glob("*/config"):
                try:
                    text = cfg.read_text()
                except (OSError, UnicodeDecodeError):
                    continue
                new = _RA_DIR_KEY.sub(lambda m: f'{m.group(1)}"{sysdir}"', text)
                if new != text:
                    cfg.write_text(new)
                    out.append(cfg)
    return out


def plugins_needed(mnesia_base: Path) -> list[str]:
    """The protocol plugins a node dir was written with, as far as its own files tell: a 4.x
    node records the MQTT plugin's feature flags in ``<node>-feature_flags``. (3.10 records
    nothing, and needs no plugin: its MQTT and STOMP messages are stored as AMQP 0-9-1.)"""
    flags: set[str] = set()
    for f in Path(mnesia_base).glob("*-feature_flags"):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        flags |= {
            w.strip("'") for w in text.replace("[", " ").replace("]", " ").replace(".", " ").replace(",", " ").split()
        }
    return sorted(p for p, names in PLUGIN_FEATURE_FLAGS.items() if flags & set(names))


def _session_cpu(sid: int) -> float:
    """CPU seconds (user and system) of the live processes of session ``sid``."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
