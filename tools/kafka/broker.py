"""Start and stop a single-node Apache Kafka broker (KRaft: broker + controller in one JVM) on loopback.

The broker jars come from Maven Central through ``tools/kafka/pom.xml`` (``.ci/kafka-setup.sh``
copies them into ``tools/kafka/lib``). This module formats the KRaft storage, starts the JVM on
free loopback ports with a small heap, waits until a metadata request through kafka-python sees
the broker, and stops it. It needs only the standard library and kafka-python, so tests,
benchmarks and the command line share it::

    python tools/kafka/broker.py serve          # prints the bootstrap address, Ctrl-C stops it
    python tools/kafka/broker.py serve --authorizer --user alice=alice-secret

The open broker (the default) lets anyone do anything; its SASL listener takes one PLAIN user.
``authorizer=True`` runs it as a secured production cluster would (``authorizer.properties.template``):
``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``, SCRAM-SHA-512 users written
into the metadata log when the storage is formatted, and a super user (:data:`ADMIN_USER`) for
setup, e.g. creating topics and ACLs (:meth:`KafkaBroker.sasl_options`).
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB = Path(os.environ.get("STREAM_VIPS_KAFKA_LIB", HERE / "lib"))
TEMPLATE = HERE / "server.properties.template"
AUTHORIZER_TEMPLATE = HERE / "authorizer.properties.template"
LOG4J = HERE / "log4j2.properties"
JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=4",
            "-Djava.awt.headless=true", "-Dlog4j2.formatMsgNoLookups=true"]
SASL_USER = "stream-vips"
SASL_PASSWORD = "stream-vips-secret"
#: The authorizer mode's super user (SCRAM-SHA-512 on the SASL listener, PLAIN for the broker itself).
ADMIN_USER = "stream-vips-admin"
ADMIN_PASSWORD = "stream-vips-admin-secret"
#: What a SCRAM user name or password may hold here (the format tool's ``--add-scram`` syntax has no escapes).
_SCRAM_SAFE = set(string.ascii_letters + string.digits + "._-")


class BrokerError(RuntimeError):
    """The broker could not be set up, started or reached."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def classpath() -> str:
    """The broker classpath; a clear error when the jars were never resolved."""
    jars = sorted(LIB.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise BrokerError(
            f"Kafka broker jars not found in {LIB}; run `bash .ci/kafka-setup.sh` "
            "(resolves tools/kafka/pom.xml from Maven Central)")
    return os.pathsep.join(str(j) for j in jars)


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    exe = Path(home, "bin", "java") if home else shutil.which("java")
    if not exe or not Path(exe).exists():
        raise BrokerError("java not found (install a JDK >= 17, e.g. `bash .ci/kafka-setup.sh`)")
    return str(exe)


class KafkaBroker:
    """One KRaft broker process with its own data directory.

    ``start()`` formats storage on first use and waits until the broker answers metadata
    requests; ``stop()`` ends the process (SIGTERM, SIGKILL after ``grace_s``) and keeps the data
    so ``start()`` can bring the same broker back on the same ports; ``cleanup()`` removes it.
    With ``authorizer=True`` the broker enforces ACLs and its SASL listener takes the SCRAM-SHA-512
    ``scram_users`` (name -> password) and :data:`ADMIN_USER`, the super user.
    """

    def __init__(self, data_dir: str | os.PathLike | None = None, port: int | None = None, *,
                 authorizer: bool = False, scram_users: Mapping[str, str] | None = None) -> None:
        if scram_users and not authorizer:
            raise BrokerError("scram_users need authorizer=True (the open broker's SASL listener is PLAIN)")
        self.authorizer = authorizer
        self.scram_users = {ADMIN_USER: ADMIN_PASSWORD, **dict(scram_users or {})} if authorizer else {}
        for name, password in self.scram_users.items():
            if not (set(name) | set(password)) <= _SCRAM_SAFE or not name or not password:
                raise BrokerError(f"SCRAM user {name!r}: names and passwords may hold only letters, digits and ._-")
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="stream-vips-kafka-"))
        self.port = port or free_port()
        self.controller_port = free_port()
        self.sasl_port = free_port()
        self.internal_port = free_port()
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.proc: subprocess.Popen | None = None
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def sasl_options(self, user: str = ADMIN_USER, password: str | None = None) -> dict[str, str]:
        """kafka-python keyword arguments that log ``user`` in on the SASL listener (SCRAM-SHA-512 in
        authorizer mode, else PLAIN); the password defaults to the one the broker was given."""
        if password is None:
            password = self.scram_users[user] if self.authorizer else SASL_PASSWORD
        return {"bootstrap_servers": self.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-512" if self.authorizer else "PLAIN",
                "sasl_plain_username": user, "sasl_plain_password": password}

    def _write_config(self) -> None:
        values = dict(port=self.port, controller_port=self.controller_port, sasl_port=self.sasl_port,
                      internal_port=self.internal_port, log_dir=self.data_dir / "log", sasl_user=SASL_USER,
                      sasl_password=SASL_PASSWORD, admin_user=ADMIN_USER, admin_password=ADMIN_PASSWORD)
        text = string.Template(TEMPLATE.read_text()).substitute(values)
        if self.authorizer:
            text += "\n" + string.Template(AUTHORIZER_TEMPLATE.read_text()).substitute(values)
        self.config_path.write_text(text)
        self.config_path.chmod(0o600)  # it holds the test users' passwords

    def _java_cmd(self, main: str, *args: str) -> list[str]:
        return [java(), *JVM_OPTS, f"-Dlog4j2.configurationFile={LOG4J}",
                f"-Dkafka.logs.dir={self.data_dir}", "-cp", classpath(), main, *args]

    def format(self) -> None:
        """Write server.properties and format the KRaft metadata log (once per data dir)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        users = [f"--add-scram=SCRAM-SHA-512=[name={name},password={password}]"
                 for name, password in self.scram_users.items()]
        cmd = self._java_cmd("kafka.tools.StorageTool", "format", "--config", str(self.config_path),
                             f"--cluster-id={self.cluster_id}", "--ignore-formatted", *users)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BrokerError(f"kafka storage format failed ({out.returncode}): {out.stderr[-2000:]}")
        meta = self.data_dir / "log" / "meta.properties"  # a data dir formatted before keeps its cluster id
        for line in meta.read_text().splitlines() if meta.exists() else ():
            if line.startswith("cluster.id="):
                self.cluster_id = line.split("=", 1)[1].strip()
        self._formatted = True

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        """Start the JVM (formatting first if needed) and wait until the broker serves."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        if not self._formatted:
            self.format()
        out = open(self.data_dir / "stdout.log", "ab")
        self.proc = subprocess.Popen(self._java_cmd("kafka.Kafka", str(self.config_path)),
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Poll with a kafka-python metadata request until the broker lists itself; a broker of
        another cluster on the port (this one then cannot bind it) is an error, not readiness."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaConfigurationError, KafkaError

        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerError(f"broker exited with {self.proc.returncode}; see {self.log_path}:\n"
                                  + self.tail())
            if not self._port_open():
                time.sleep(0.1)
                continue
            try:
                where = self.sasl_options() if self.authorizer else {"bootstrap_servers": self.bootstrap}
                admin = KafkaAdminClient(**where, request_timeout_ms=3000, bootstrap_timeout_ms=3000,
                                         reconnect_backoff_max_ms=200)
                try:
                    cluster = admin.describe_cluster()
                finally:
                    admin.close()
                if cluster.get("cluster_id") not in (None, self.cluster_id):
                    raise BrokerError(f"port {self.port} is taken by another Kafka cluster "
                                      f"({cluster['cluster_id']}); choose another port")
                if cluster.get("brokers"):
                    return
            except KafkaConfigurationError:
                raise
            except (KafkaError, OSError) as exc:
                last = exc
            time.sleep(0.2)
        raise BrokerError(f"broker not ready after {timeout_s}s ({last!r}); log tail:\n{self.tail()}")

    def _port_open(self) -> bool:
        """A plain TCP connect first: kafka-python backs off for many seconds after a refusal."""
        try:
            with socket.create_connection(("127.0.0.1", self.sasl_port if self.authorizer else self.port), timeout=1):
                return True
        except OSError:
            return False

    def tail(self, n: int = 40) -> str:
        for p in (self.log_path, self.data_dir / "stdout.log"):
            if p.exists():
                return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the broker process (SIGTERM, then SIGKILL); the data directory is kept."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def cleanup(self) -> None:
        """Stop and delete the data directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="start a broker, print its bootstrap address, stop on Ctrl-C/SIGTERM")
    s.add_argument("--data-dir")
    s.add_argument("--port", type=int)
    s.add_argument("--authorizer", action="store_true", help="enforce ACLs; SCRAM-SHA-512 users on the SASL listener")
    s.add_argument("--user", action="append", default=[], metavar="NAME=PASSWORD",
                   help="a SCRAM user (with --authorizer)")
    sub.add_parser("check", help="start a broker, wait until it serves, stop it")
    args = p.parse_args(argv)
    users = dict(u.split("=", 1) for u in getattr(args, "user", []))
    broker = KafkaBroker(getattr(args, "data_dir", None), getattr(args, "port", None),
                         authorizer=getattr(args, "authorizer", False), scram_users=users)
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # also while starting: the JVM is stopped below
    try:
        broker.start()
        print(f"kafka broker ready at {broker.bootstrap} (SASL {broker.sasl_bootstrap}) in "
              f"{time.monotonic() - t0:.1f}s", flush=True)
        if args.cmd == "serve":
            while broker.proc is not None and broker.proc.poll() is None:
                time.sleep(1)
    except KeyboardInterrupt:
        pass
    except BrokerError as exc:
        print(f"kafka broker failed: {exc}", file=sys.stderr)
        return 1
    finally:
        broker.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
