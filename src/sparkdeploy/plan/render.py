"""render(Plan) -> {relative path: bytes}: every file a deployment writes, from templates kept as data.

Templates (jinja2, StrictUndefined): `images/serving.Dockerfile.j2`, `deploy/templates/engine.env.j2`,
`deploy/templates/launch.sh.j2`, `systemd/sparkdeploy-engine.service.j2`. Same plan -> same bytes.

Output layout (what `sparkdeploy render --out DIR` writes):

    plan.json                                   the whole plan (sparkdeploy plan --json)
    image/Dockerfile                            serving image; context = image/ + overlays/ (no list)
    <node>/release/engine.env                   docker --env-file (KEY=VALUE, literal, this node's values only)
    <node>/release/launch.sh                    foreground `exec docker run ...` (mode 0755)
    <node>/release/node-plan.json               this node's part of the plan (argv, env, memory budget)
    <node>/unit/sparkdeploy-engine.service      systemd unit
    <head>/monitoring/sparkdeploy-exporter.service   the head's Prometheus exporter (unless ports.metrics is 0)

On-node layout (the steps layer installs it; `sparkdeploy.ops.releases` numbers the releases). This is an
inventory without `services:`; each entry of `services:` has its own under /etc/sparkdeploy/services/<name>
and /var/lib/sparkdeploy/services/<name>, and units named sparkdeploy-engine-<name>.service and so on
(`layout.ServiceLayout`), so services can share a node:

    /etc/sparkdeploy/releases/NNNN/{engine.env,launch.sh,node-plan.json,release.json}
    /etc/sparkdeploy/current -> releases/NNNN   switched atomically once every node holds NNNN
    /etc/systemd/system/sparkdeploy-engine.service   runs /etc/sparkdeploy/current/launch.sh; the same
                                                bytes for every release, so switching needs no daemon-reload
    /var/lib/sparkdeploy/vocab/current.txt      draft vocab (relative symlink to <sha256>.txt), mounted
                                                read-only at /opt/sparkdeploy/vocab: a vocab rollout moves
                                                the pointer, swapped live by a head with room for it, else
                                                with a restart
    /var/lib/sparkdeploy/cache/{huggingface,vllm,flashinfer,triton}   warm-start caches (GB10 profiles)

Rollback = point `current` at the previous release and restart the units (workers first). Nothing in a
release directory names the release directory itself: launch.sh reads `current/engine.env`, so a release is
valid under any number.

Quoting: every value that reaches shell text goes through `shlex.quote` (filter `sh`/`shargs`); unit text
goes through systemd escaping (`sd`); Dockerfile label values are JSON strings (`dq`). The inventory also
rejects control characters, so no value can start a new line, command or directive.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from sparkdeploy import paths
from sparkdeploy.errors import InputError
from sparkdeploy.node.layout import ENV_FILE, EXPORTER_CODE_DIR, LAUNCH_FILE, SENTINEL_RECORD, VOCAB_CONTAINER_DIR
from sparkdeploy.plan import Plan

DOCKERFILE_TEMPLATE = "images/serving.Dockerfile.j2"
ENV_TEMPLATE = "deploy/templates/engine.env.j2"
LAUNCH_TEMPLATE = "deploy/templates/launch.sh.j2"
UNIT_TEMPLATE = "systemd/sparkdeploy-engine.service.j2"
EXPORTER_TEMPLATE = "systemd/sparkdeploy-exporter.service.j2"
EXECUTABLE = (LAUNCH_FILE,)


def systemd_escape(value: Any) -> str:
    """Escape free text for a unit file value: no line breaks, `%` specifiers and backslashes doubled."""
    text = str(value)
    if any(ch in text for ch in "\n\r\x00"):
        raise ValueError(f"line break in unit text: {text!r}")
    return text.replace("\\", "\\\\").replace("%", "%%")


def systemd_args(argv: Any) -> str:
    """argv as an Exec= line: plain words as they are, anything else double-quoted (systemd's own quoting)."""
    words = []
    for arg in argv:
        text = systemd_escape(arg).replace("$", "$$")
        if not text or not all(ch.isalnum() or ch in "_@%+=:,./-" for ch in text):
            text = '"' + text.replace('"', '\\"') + '"'
        words.append(text)
    return " ".join(words)


def _shargs(argv: Any, *breaks: int) -> str:
    """Shell words of argv, one option (with its value) per continued line; also a break at `breaks`."""
    lines: list[list[str]] = [[]]
    for i, arg in enumerate(argv):
        text = str(arg)
        if lines[-1] and (text.startswith("-") or i in breaks):
            lines.append([])
        lines[-1].append(shlex.quote(text))
    return " \\\n  ".join(" ".join(words) for words in lines)


@functools.lru_cache(maxsize=4)
def _environment_for(root: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(root),
                             undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
                             trim_blocks=False, lstrip_blocks=False)
    env.filters.update(sh=lambda v: shlex.quote(str(v)), shargs=_shargs, sd=systemd_escape, sdargs=systemd_args,
                       dq=lambda v: json.dumps(str(v), ensure_ascii=False))
    return env


def environment() -> jinja2.Environment:
    """The one jinja2 environment for every template under `paths.templates_root()` (StrictUndefined, no
    autoescape, trailing newline kept, no block trimming; filters sh, shargs, sd, dq)."""
    return _environment_for(str(paths.templates_root()))


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()


def render(plan: Plan) -> dict[str, bytes]:
    """Every artifact of `plan` as {relative path: content}; deterministic."""
    env = environment()
    lay = plan.layout
    common = dict(plan=plan, kit_version=plan.kit_version, current_link=lay.current_link, unit_name=lay.unit,
                  vocab_host_dir=lay.vocab_host_dir, vocab_container_dir=VOCAB_CONTAINER_DIR,
                  vocab_host_file=lay.vocab_pointer)
    shortlist = plan.feature_enabled("shortlist")
    host_dir = plan.model_host_dir
    out: dict[str, bytes] = {
        "plan.json": _json_bytes(plan.to_dict()),
        "image/Dockerfile": env.get_template(DOCKERFILE_TEMPLATE).render(image=plan.image, **common).encode(),
    }
    for node in plan.nodes:
        description = (f"sparkdeploy vLLM engine: {plan.cluster} node {node.name}, rank {node.rank} of "
                       f"{plan.nnodes} ({node.role})")
        ctx = dict(node=node, shortlist=shortlist, host_dir=host_dir, description=description, **common)
        node_dict = next(raw for raw in plan.to_dict()["nodes"] if raw["name"] == node.name)
        out[f"{node.name}/release/{ENV_FILE}"] = env.get_template(ENV_TEMPLATE).render(**ctx).encode()
        out[f"{node.name}/release/{LAUNCH_FILE}"] = env.get_template(LAUNCH_TEMPLATE).render(**ctx).encode()
        out[f"{node.name}/release/node-plan.json"] = _json_bytes(
            {"release_id": plan.release_id, "cluster": plan.cluster, "image": plan.image.tag, "node": node_dict})
        out[f"{node.name}/unit/{lay.unit}"] = env.get_template(UNIT_TEMPLATE).render(**ctx).encode()
    if plan.metrics_port:
        out[f"{plan.head.name}/monitoring/{lay.exporter_unit}"] = env.get_template(EXPORTER_TEMPLATE).render(
            kit_version=plan.kit_version, code_dir=EXPORTER_CODE_DIR, port=plan.metrics_port,
            container=lay.exporter_container, argv=exporter_argv(plan)).encode()
    return dict(sorted(out.items()))


def exporter_argv(plan: Plan) -> list[str]:
    """`docker run` of the exporter in the serving image: host network (it reads the engine on loopback and
    serves Prometheus), the kit's code and the state it reads mounted read-only, as nobody, no capabilities;
    every series labelled with the service and the head's name.
    --init: python as the container's PID 1 ignores SIGTERM, so every stop (each new image tag restarts it)
    waited out `docker stop --time 5` and killed it."""
    python, lay = shlex.split(plan.image.python), plan.layout
    return ["/usr/bin/docker", "run", "--rm", "--init", "--name", lay.exporter_container, "--network", "host",
            "--user", "65534:65534", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--read-only", "--memory", "512m", "--env", "PYTHONPATH=/opt/sparkdeploy-kit",
            "--env", "PYTHONDONTWRITEBYTECODE=1",
            "-v", f"{EXPORTER_CODE_DIR}:/opt/sparkdeploy-kit:ro", "-v", f"{lay.etc_dir}:{lay.etc_dir}:ro",
            "-v", f"{lay.state_dir}:{lay.state_dir}:ro", "--entrypoint", python[0], plan.image.tag, *python[1:],
            "-m", "sparkdeploy.checks.exporter", "--listen", f"0.0.0.0:{plan.metrics_port}",
            "--engine", f"http://127.0.0.1:{plan.api_port}", "--state", lay.watchdog_state,
            "--current", lay.current_link, "--sentinel", f"{lay.current_link}/{SENTINEL_RECORD}",
            "--service", exporter_service(plan), "--node", plan.head.name,
            "--memory-reserve-gib", f"{plan.head.memory.reserve_gib:g}"]


def exporter_service(plan: Plan) -> str:
    """The `service` label of the exporter's series: the service's name, or the cluster's for an inventory
    without `services:`."""
    return plan.service or plan.cluster


PROMETHEUS_TARGETS = "prometheus-targets.json"


def prometheus_targets(plans: list[Plan]) -> bytes:
    """Prometheus' file_sd list of every service head's exporter (`render` writes it as PROMETHEUS_TARGETS;
    deploy/monitoring/prometheus.yml reads it): one target per service, addressed as the kit reaches the head
    (its ssh host), labelled with the service and the head, as the exporter labels its own series."""
    return _json_bytes([{"targets": [f"{p.head.ssh.host}:{p.metrics_port}"],
                         "labels": {"service": exporter_service(p), "node": p.head.name}}
                        for p in plans if p.metrics_port])


def overlays_digest() -> str | None:
    """Identity of the overlays package copied into the image build context (feeds the image tag)."""
    return paths.tree_digest(paths.overlays_dir())


def file_mode(relative: str) -> int:
    return 0o755 if relative.rsplit("/", 1)[-1] in EXECUTABLE else 0o644


def write(plan: Plan, out_dir: str | Path) -> list[Path]:
    """Write `render(plan)` under out_dir (created if missing); return the written paths.

    Nothing already inside out_dir is followed: a symbolic link (or a file where a directory goes) on any path
    we write is refused before anything is written, and each file is a new file renamed into place, so a
    planted link cannot redirect a write or a chmod to a file elsewhere."""
    root = Path(out_dir)
    files = render(plan)
    try:
        if root.exists() and not root.is_dir():
            raise InputError(f"--out {root}: not a directory (a file or a device); give a directory, created if "
                             "missing")
        for rel in files:
            _refuse_links(root, rel)
    except OSError as err:  # a name too long, a path through a file
        raise InputError(f"--out {str(root)[:80]}: {err.strerror or err}") from None
    written = []
    for rel, data in files.items():
        target = root / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError(f"--out {str(root)[:80]}: cannot create {target.parent.name}/ "
                             f"({err.strerror or err})") from None
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), file_mode(rel))
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        written.append(target)
    return written


def _refuse_links(root: Path, rel: str) -> None:
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        path = root.joinpath(*parts[:depth])
        is_file = depth == len(parts)
        if path.is_symlink():
            raise InputError(f"{path} is a symbolic link; render --out writes only real files and directories "
                             "(remove it, or render into an empty directory)")
        if path.exists() and path.is_dir() == is_file:
            raise InputError(f"{path} is a {'directory' if is_file else 'file'} where render writes a "
                             f"{'file' if is_file else 'directory'}; render into an empty directory")
