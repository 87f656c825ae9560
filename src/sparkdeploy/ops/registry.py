"""The head's image registry: the CNCF Distribution registry (`docker-registry`, Debian/Ubuntu) as a supervised
unit, so a node that lacks some layers of the serving image pulls only those (docker push/pull compare layers by
digest; `docker save | docker load` has no incremental mode and re-sends the whole base every time).

    /etc/sparkdeploy/registry/config.yml           listens on <head data_ip>:5443 only (the data plane), TLS
    /etc/sparkdeploy/registry/{ca,registry}.crt    a kit-made CA and the server certificate for that address
    /etc/sparkdeploy/registry/registry.key         (the CA's key is thrown away once it has signed: nothing
                                                   else can be issued under it)
    /var/lib/sparkdeploy/registry                  layer store
    /etc/systemd/system/sparkdeploy-registry.service   systemd/sparkdeploy-registry.service.j2
    /etc/docker/certs.d/<ip>:5443/ca.crt (every node)  how dockerd trusts it: no restart, no insecure-registries

The Debian package's own `docker-registry.service` listens on every interface; it is stopped and disabled.
Nothing here reaches a registry outside the cluster.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import re
import socket
import threading
from dataclasses import dataclass
from typing import Iterator

from sparkdeploy import poll
from sparkdeploy.errors import RemoteError
from sparkdeploy.node.layout import REGISTRY_CONFIG_DIR, REGISTRY_PORT, REGISTRY_STORAGE_DIR, REGISTRY_UNIT
from sparkdeploy.remote.connection import Conn, narrate

PORT = REGISTRY_PORT
CONFIG_DIR = REGISTRY_CONFIG_DIR
CONFIG = f"{CONFIG_DIR}/config.yml"
CA_FILE, CERT_FILE, KEY_FILE = f"{CONFIG_DIR}/ca.crt", f"{CONFIG_DIR}/registry.crt", f"{CONFIG_DIR}/registry.key"
STORAGE_DIR = REGISTRY_STORAGE_DIR
UNIT_NAME = REGISTRY_UNIT
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
UNIT_TEMPLATE = "systemd/sparkdeploy-registry.service.j2"
PACKAGE_UNIT = "docker-registry.service"
BINARY = "/usr/bin/docker-registry"


def address(data_ip: str) -> str:
    return f"{data_ip}:{PORT}"


def trust_path(addr: str) -> str:
    return f"/etc/docker/certs.d/{addr}/ca.crt"


def config_text(data_ip: str) -> bytes:
    """Filesystem storage, TLS, bound to the data-plane address; no blob-descriptor cache (a layer removed from
    the store must read as missing, so the next push uploads it again)."""
    return (f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {STORAGE_DIR}\n"
            f"  delete:\n    enabled: true\nhttp:\n  addr: {address(data_ip)}\n  tls:\n"
            f"    certificate: {CERT_FILE}\n    key: {KEY_FILE}\n").encode()


def unit_text() -> bytes:
    from sparkdeploy.plan import render

    return render.environment().get_template(UNIT_TEMPLATE).render(binary=BINARY, config=CONFIG).encode()


def make_tls(data_ip: str, days: int = 3650) -> dict[str, bytes]:
    """{ca.crt, registry.crt, registry.key}: a one-use CA and a server certificate for `data_ip` (IP SAN)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=days)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sparkdeploy registry CA {data_ip}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, data_ip)])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(data_ip))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return {CA_FILE: ca.public_bytes(pem), CERT_FILE: cert.public_bytes(pem),
            KEY_FILE: key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())}


def cert_serves(cert_pem: bytes | None, ca_pem: bytes | None, data_ip: str, margin_days: int = 30) -> bool:
    """Does the head's certificate name `data_ip`, chain to its CA and stay valid for `margin_days`?"""
    if not cert_pem or not ca_pem:
        return False
    from cryptography import x509

    try:
        cert, ca = x509.load_pem_x509_certificate(cert_pem), x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
        ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.IPAddress)
    except Exception:  # noqa: BLE001 - an unreadable or foreign certificate is replaced
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    return ipaddress.ip_address(data_ip) in ips and left > datetime.timedelta(days=margin_days)


def ensure(head: Conn, data_ip: str, log=lambda msg: None) -> tuple[bytes, list[str]]:
    """The registry running on the head as described above; returns (CA certificate, what was changed)."""
    done: list[str] = []
    if not head.exists(BINARY):
        raise RemoteError(f"{BINARY} is missing: install the `docker-registry` package on the head "
                          "(apt-get install docker-registry)", node=head.name)
    ca, cert = head.get(CA_FILE), head.get(CERT_FILE)
    want = {CONFIG: config_text(data_ip), UNIT_PATH: unit_text()}
    if not cert_serves(cert, ca, data_ip):
        tls = make_tls(data_ip)
        want.update(tls)
        ca = tls[CA_FILE]
        done.append(f"new TLS certificate for {address(data_ip)}")
    changed = [p for p, data in want.items() if head.get(p) != data]
    if changed:
        head.run(["mkdir", "-p", CONFIG_DIR, STORAGE_DIR])
        for p in changed:
            head.put(p, want[p], mode=0o600 if p == KEY_FILE else 0o644)
        done.append(f"wrote {', '.join(changed)}")
    if head.query(["systemctl", "is-enabled", "--quiet", PACKAGE_UNIT], check=False).ok or \
            head.query(["systemctl", "is-active", "--quiet", PACKAGE_UNIT], check=False).ok:
        head.run(["systemctl", "disable", "--now", PACKAGE_UNIT], check=False, timeout=60)
        done.append(f"stopped and disabled {PACKAGE_UNIT} (it listens on every interface)")
    active = head.query(["systemctl", "is-active", "--quiet", UNIT_NAME], check=False).ok
    if changed or not active:
        head.run(["systemctl", "daemon-reload"])
        head.run(["systemctl", "enable", UNIT_NAME], timeout=60)
        head.run(["systemctl", "restart", UNIT_NAME], timeout=60)
        done.append(f"(re)started {UNIT_NAME}")
    for d in done:
        narrate(log, f"{head.name}: registry: {d}")
    wait_answering(head, data_ip)
    return ca, done


_PROBE = ("import ssl,sys,urllib.request as u\n"
          "c=ssl.create_default_context(cafile=sys.argv[2])\n"
          "u.urlopen('https://'+sys.argv[1]+'/v2/',context=c,timeout=5).read()\n")


def wait_answering(head: Conn, data_ip: str, timeout: float = 30) -> None:
    """The registry's API answers over TLS, verified against its CA (from the head itself)."""
    def attempt() -> None:
        res = head.query(["python3", "-c", _PROBE, address(data_ip), CA_FILE], check=False, timeout=30,
                         answer="")  # the registry this run (re)started: a dry run started none
        if not res.ok:
            raise poll.NotYet((res.stderr or "").strip()[-300:])

    try:
        poll.until(attempt, timeout=timeout, interval=0.5)
    except poll.TimedOut as out:
        status = head.query(["systemctl", "status", "--no-pager", "-n", "5", UNIT_NAME], check=False).stdout
        raise RemoteError(f"registry at https://{address(data_ip)} does not answer: {out.last} | "
                          f"{status.strip()[-500:]}", node=head.name) from None


def trust(conn: Conn, addr: str, ca: bytes) -> bool:
    """Install the registry CA for dockerd (read per connection, no restart); True if it was written."""
    path = trust_path(addr)
    if conn.get(path) == ca:
        return False
    conn.run(["mkdir", "-p", path.rsplit("/", 1)[0]])
    conn.put(path, ca)
    return True


def manifest(head: Conn, repository: str, tag: str) -> dict | None:
    """The manifest the head's registry holds for repository:tag (read from its store), or None."""
    root = f"{STORAGE_DIR}/docker/registry/v2"
    link = head.get(f"{root}/repositories/{repository}/_manifests/tags/{tag}/current/link")
    if not link:
        return None
    digest = link.decode().strip().split(":", 1)[1]
    data = head.get(f"{root}/blobs/sha256/{digest[:2]}/{digest}/data")
    return json.loads(data) if data else None


def holds(head: Conn, image_tag: str, image_id: str) -> bool:
    """Does the registry hold `image_tag` as exactly this image (config digest = image ID)?"""
    repository, tag = image_tag.rsplit(":", 1)
    man = manifest(head, repository, tag)
    return bool(man) and man.get("config", {}).get("digest") == image_id


# The registry's access log (combined log format): `IP - - [time] "METHOD URI PROTO" STATUS BYTES ...`
ACCESS_LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "[A-Z]+ [^"]*" \d{3} (\d+)')


def log_cursor(head: Conn) -> str | None:
    """Where the registry's journal ends now (None: it has no entries yet), for `bytes_sent` to read on from."""
    res = head.query(["journalctl", "-u", UNIT_NAME, "-n", "0", "--show-cursor", "-o", "cat"], check=False)
    return next((line.split(":", 1)[1].strip() for line in res.stdout.splitlines()
                 if line.startswith("-- cursor:")), None)


def bytes_sent(head: Conn, cursor: str | None) -> dict[str, int]:
    """{client address: response bytes} the registry logged after `cursor`: the layers and manifests it sent
    each node, whatever else crossed the node's links meanwhile (serving ranks, SSH, API traffic)."""
    head.query(["journalctl", "--sync"], check=False)  # entries the registry has written are readable
    argv = ["journalctl", "-u", UNIT_NAME, "-o", "cat", "--no-pager"] + ([f"--after-cursor={cursor}"] if cursor else [])
    return sent_by_client(head.query(argv, check=False, timeout=60).stdout)


def sent_by_client(log: str) -> dict[str, int]:
    """{client address: response bytes} summed over the access-log lines of `log` (other lines are skipped)."""
    sent: dict[str, int] = {}
    for line in log.splitlines():
        if m := ACCESS_LINE.match(line):
            sent[m[1]] = sent.get(m[1], 0) + int(m[2])
    return sent


def layer_sizes(head: Conn, image_tag: str) -> dict[str, int]:
    """{layer digest: compressed bytes} of `image_tag` in the registry (what a pull moves per missing layer)."""
    repository, tag = image_tag.rsplit(":", 1)
    man = manifest(head, repository, tag) or {}
    return {layer["digest"]: layer["size"] for layer in man.get("layers", [])}


def collect(head: Conn, repository: str, keep_tags: set[str]) -> list[str]:
    """Registry garbage collection: untag what no kept release names, then free the blobs no tag reaches
    (`docker-registry garbage-collect --delete-untagged`, with the registry stopped so no push races it).
    Returns the tags removed; nothing to remove costs one listing."""
    tags_dir = f"{STORAGE_DIR}/docker/registry/v2/repositories/{repository}/_manifests/tags"
    have = head.query(["ls", "-1", tags_dir], check=False).stdout.split()
    drop = sorted(t for t in have if f"{repository}:{t}" not in keep_tags)
    if not drop:
        return []
    head.run(["rm", "-rf", *[f"{tags_dir}/{t}" for t in drop]])
    head.run(["systemctl", "stop", UNIT_NAME], timeout=60)
    try:
        head.run([BINARY, "garbage-collect", "--delete-untagged", CONFIG], timeout=600)
    finally:
        head.run(["systemctl", "start", UNIT_NAME], timeout=60)
    return drop


@dataclass
class Tunnel:
    port: int | str  # on 127.0.0.1 here (a dry run's placeholder names the far end)
    sent: int = 0  # bytes sent through it to the far end (what the SSH server's node received, less SSH framing)


@contextlib.contextmanager
def tunnel(conn: Conn, host: str, port: int) -> Iterator[Tunnel]:
    """A loopback port on this machine forwarded through `conn`'s SSH session to host:port (as `ssh -L`).

    Used to push an image built on this machine into the head's registry: the registry listens on the data
    plane only, which this machine may not reach; its dockerd treats 127.0.0.0/8 as a trusted local address."""
    transport = conn.client.get_transport()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()
    opened, counting = Tunnel(listener.getsockname()[1]), threading.Lock()

    def pump(src, dst):
        """Copy one direction; when it ends, close both ends (never a half-close: paramiko can send the EOF
        of a channel the server has already freed, and OpenSSH then drops the whole connection)."""
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
                if not isinstance(dst, socket.socket):  # into the SSH channel
                    with counting:
                        opened.sent += len(chunk)
        except OSError:
            pass
        for end in (src, dst):
            with contextlib.suppress(OSError):
                if isinstance(end, socket.socket):
                    end.shutdown(socket.SHUT_RDWR)  # wakes the other pump's recv and sends the FIN
                end.close()

    def serve():
        while not stop.is_set():
            try:
                sock, peer = listener.accept()
            except OSError:
                return
            try:
                chan = transport.open_channel("direct-tcpip", (host, port), peer)
            except Exception:  # noqa: BLE001 - the client sees its connection closed
                sock.close()
                continue
            threading.Thread(target=pump, args=(sock, chan), daemon=True).start()
            threading.Thread(target=pump, args=(chan, sock), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield opened
    finally:
        stop.set()
        listener.close()
