"""plan(Inventory, facts per node) -> Plan: every command, env var, file and memory figure, as data. Pure.

Kamal's split: this module only *builds* argv lists and env maps; `render` turns them into files and the step
layer runs them. Nothing here touches a node, the network or the clock, so a plan is fully unit-testable and
`sparkdeploy plan` can show it before anything changes.

Decisions made here (see DESIGN.md "Launch facts"):
  * mp multi-node: every node runs the same `vllm serve ... --nnodes N --node-rank R --master-addr <head data
    IP> --master-port P`; rank >= 1 adds `--headless`; only rank 0 serves the API; workers start first.
  * ray multi-node (`backend: ray`): each worker's container is `ray start --address <head data IP>:<master
    port> --block`; the head's starts Ray's head on the master port, then `vllm serve
    --distributed-executor-backend ray`, whose placement group waits until every worker has joined.
  * Per-node env comes from *that node's* inventory entry and facts only (cross-wired pairs differ in netdev,
    HCA names and GID index; nothing is copied from the head).
  * Which patches are vLLM flags and which are overlays: `spark_overlays.compat` (the plugin's own table).
  * The GPU memory fraction: `memory.budget` (the only place it is decided).

The plan's fingerprint (`Plan.release_id`) is a hash of everything that reaches a node except provenance
labels (git commit): same inventory + facts -> same id, any change -> a new release directory on the nodes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from spark_overlays.compat import series
from sparkdeploy import __version__
from sparkdeploy.errors import BudgetError, PlanError
from sparkdeploy.model import checkpoint as checkpoint_mod
from sparkdeploy.model import engine_args
from sparkdeploy.model.checkpoint import Checkpoint
from sparkdeploy.model.inventory import Inventory, Node, SshTarget
from sparkdeploy.model.schema import FEATURES
from sparkdeploy.node.facts import GIB, NodeFacts, facts_for
from sparkdeploy.node.layout import (
    CACHE_HOST_DIR,
    CAPTURE_SCHEDULER,
    ENV_FILE,
    LAUNCH_FILE,
    NODE_PLAN_FILE,
    PLAIN,
    REGISTRY_PORT,
    VOCAB_CONTAINER_DIR,
    VOCAB_CONTAINER_FILE,
    ServiceLayout,
)
from sparkdeploy.plan.memory import MemoryBudget, budget, shortlist_head_gib

STOP_TIMEOUT_S = 30
# A headless rank has nothing to finish once the head is stopped (it is stopped after the head), and vLLM's
# worker then sits out its own 5 s + 4 s escalation before it exits: 12.7 s of every restart on the sim pair.
# docker kills it after this grace instead (2.4 s); the unit counts that kill (exit 137) as a clean stop.
HEADLESS_STOP_TIMEOUT_S = 2


def stop_timeout_s(role: str) -> int:
    """The grace `docker stop` gives a rank before it kills it: the head's API server drains; a worker's none."""
    return STOP_TIMEOUT_S if role == "head" else HEADLESS_STOP_TIMEOUT_S


_RELEASE_PLACEHOLDER = "@RELEASE@"
# Ray's shared-memory object store. Its default, 30% of memory, would claim ~38 GB of a Spark's unified memory
# beside the KV cache; vLLM moves only control messages through it (tensors go over NCCL).
RAY_OBJECT_STORE_BYTES = 512 * 2**20

CACHE_MOUNTS = (("huggingface", "/root/.cache/huggingface"), ("vllm", "/root/.cache/vllm"),
                ("flashinfer", "/root/.cache/flashinfer"), ("triton", "/root/.triton"))


# ----------------------------------------------------------------------------------------------- types


@dataclass(frozen=True)
class ImageSpec:
    tag: str  # repository:<vllm>-<content hash>
    repository: str
    base: str
    vllm_version: str
    python: str
    pip: str
    local_base: bool
    vocab_source: str | None  # host path of the draft list: runtime data on the nodes (bind-mounted), not in the image
    labels: dict[str, str] = field(default_factory=dict)
    registry: str = ""  # <head data_ip>:<port>: the head's registry every node pulls the image's layers from
    transfers: tuple[str, ...] = ()  # which path each image transfer takes (build, push, pull per node)


@dataclass(frozen=True)
class Feature:
    name: str
    requested: bool  # patches.<name> in the inventory
    enabled: bool  # in effect for this plan
    mode: str  # "native" | "overlay"
    reason: str = ""


@dataclass(frozen=True)
class NodePlan:
    name: str
    role: str  # "head" | "worker"
    rank: int
    start_order: int  # 0 starts first (workers), the head last
    ssh: SshTarget
    data_ip: str
    netdev: str
    hca: tuple[str, ...]
    serve_argv: tuple[str, ...]
    docker_argv: tuple[str, ...]
    env: dict[str, str]
    memory: MemoryBudget
    files: dict[str, str]  # render output path (relative) -> on-node path ("{release}/x": inside the release dir)
    container_name: str = PLAIN.container
    unit_name: str = PLAIN.unit

    @property
    def stop_timeout_s(self) -> int:
        return stop_timeout_s(self.role)

    @property
    def serve_command(self) -> str:
        return shlex.join(self.serve_argv)

    @property
    def docker_command(self) -> str:
        return shlex.join(self.docker_argv)


@dataclass(frozen=True)
class Plan:
    cluster: str
    release_id: str
    kit_version: str
    profile: str
    nnodes: int
    tp: int
    pp: int
    api_port: int
    master_port: int
    image: ImageSpec
    nodes: tuple[NodePlan, ...]  # rank order
    features: tuple[Feature, ...]
    additional_config: dict[str, Any]
    speculative_config: dict[str, Any] | None
    model_host_dir: str | None = None  # host checkpoint dir (page cache evicted before launch)
    notes: tuple[str, ...] = ()
    checkpoint: Checkpoint | None = None  # the weights' format, decides the quantization flags
    secrets: dict[str, str] = field(default_factory=dict)  # env name -> fingerprint of what layout.secrets_env holds
    weights_transfers: tuple[str, ...] = ()  # which path the checkpoint takes to each node
    capture: bool = False  # traffic capture wired in (counts only while `vocab capture on`: no restart to switch)
    metrics_port: int = 0  # the head's Prometheus exporter (steps/monitoring.py); 0 = none. Not the engine's:
    # outside the release identity
    service: str | None = None  # its name in the inventory's `services:` (None: the inventory is one service)
    backend: str = "mp"  # how the ranks meet: vLLM's multi-node launcher (mp) or a Ray cluster (ray)

    def feature_enabled(self, name: str) -> bool:
        return any(f.name == name and f.enabled for f in self.features)

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    @property
    def layout(self) -> ServiceLayout:
        return ServiceLayout(self.service)

    @property
    def start_order(self) -> tuple[NodePlan, ...]:
        return tuple(sorted(self.nodes, key=lambda n: n.start_order))

    @property
    def api_url(self) -> str:
        return f"http://{self.head.data_ip}:{self.api_port}"

    @property
    def served_name(self) -> str:
        """The model name the engine serves under (what a probe asks for), from the head's argv: a recorded
        release (`as_served`) answers under the name it was started with."""
        argv = list(self.head.serve_argv)
        return argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[2]

    def node(self, name: str) -> NodePlan:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def served_as(self) -> dict[str, Any]:
        """What judges a release once it is kept: where it answers, under which name, what memory each rank was
        budgeted, which checkpoint it evicts. Recorded in its release.json (steps/release.py) so that a rollback,
        the automatic one included, judges it by this and never by a later inventory (`as_served`)."""
        return {"api_port": self.api_port, "model_host_dir": self.model_host_dir,
                "nodes": {n.name: {"data_ip": n.data_ip, "serve_argv": list(n.serve_argv),
                                   "memory": dataclasses.asdict(n.memory)} for n in self.nodes}}

    def as_served(self, record: Mapping[str, Any] | None) -> "Plan":
        """This plan with what `record` (a release's `served_as()`) says that release was judged by; unchanged
        for a release from a kit that recorded none, or one recorded on other nodes."""
        if not record or set(record.get("nodes", {})) != {n.name for n in self.nodes}:
            return self
        nodes = tuple(dataclasses.replace(n, data_ip=r["data_ip"], serve_argv=tuple(r["serve_argv"]),
                                          memory=MemoryBudget(**r["memory"]))
                      for n, r in ((n, record["nodes"][n.name]) for n in self.nodes))
        return dataclasses.replace(self, api_port=record["api_port"], model_host_dir=record["model_host_dir"],
                                   nodes=nodes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["api_url"] = self.api_url
        out["start_order"] = [n.name for n in self.start_order]
        for node, raw in zip(self.nodes, out["nodes"]):
            raw["serve_command"] = node.serve_command
            raw["docker_command"] = node.docker_command
        return out


# ------------------------------------------------------------------------------------------ compat table
def _compat_mode() -> tuple[Callable[[str, str], str], Callable[[str, str], list[str]]]:
    """The overlays plugin's own table decides native flag vs overlay, so planner and image never disagree."""
    from spark_overlays import compat  # pure module: no vllm/torch import

    return compat.mode, compat.native_flags


def _off_by_default(version: str, name: str) -> str:
    """Why the pin's row keeps a requested patch off (no measurement yet), from the overlays' compat table."""
    from spark_overlays import compat

    try:
        return compat.support(version, name).off_by_default
    except compat.CompatError:
        return ""


# ------------------------------------------------------------------------------------------------ plan
def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _checkpoint(profile, measured: Checkpoint | None) -> Checkpoint | None:
    """The checkpoint read from the head's files wins; a profile that declares another format is an error."""
    if measured is not None and profile.checkpoint_format and measured.format != profile.checkpoint_format:
        raise PlanError(f"{profile.file}: checkpoint.format: the profile says {profile.checkpoint_format} but the "
                        f"checkpoint on the head ({measured.source}) is {measured.format}")
    if measured is not None:
        return measured
    return Checkpoint(profile.checkpoint_format, "profile") if profile.checkpoint_format else None


def _features(inv: Inventory, mode_of: Callable[[str, str], str], ckpt: Checkpoint | None) -> tuple[Feature, ...]:
    profile, version = inv.profile, inv.image.vllm_version
    out = []
    for name in FEATURES:
        requested = getattr(inv.patches, name)
        try:
            mode = mode_of(version, name)
        except Exception as err:  # CompatError and friends: an unsupported pin is an input problem
            raise PlanError(f"image.vllm_version: {err}") from None
        enabled, reason = requested, "" if requested else "off in inventory patches"
        spec = profile.speculative
        if requested and name == "shortlist" and (spec.method != "mtp" or spec.num_speculative_tokens == 0):
            enabled, reason = False, f"needs MTP speculation (profile uses {spec.method} depth {spec.num_speculative_tokens})"
        quantized_head = dict(spec.extra).get("draft_lm_head_quantization")
        if enabled and name == "shortlist" and quantized_head:
            enabled, reason = False, (f"the profile quantizes the shared draft head (draft_lm_head_quantization: "
                                      f"{quantized_head}); vLLM cannot stack that with a draft head of its own "
                                      "(bench/draft_head_levers.py compares the two levers)")
        if requested and name == "prefix_align" and not profile.prefix_caching:
            enabled, reason = False, "prefix caching is off in the profile"
        if requested and name == "fp8_gdn":
            enabled, reason = checkpoint_mod.fp8_gdn_applies(ckpt)
        if enabled and _off_by_default(version, name):
            enabled, reason = False, _off_by_default(version, name)
        out.append(Feature(name, requested, enabled, mode, reason))
    return tuple(out)


@dataclass(frozen=True)
class ShortlistHead:
    """The shortlisted draft head a plan starts: its row capacity, fixed at start, and whether a new list can
    reach it inside the running engine (overlays/README.md "Live list swap")."""

    rows: int  # ids in the inventory's list
    capacity: int  # the profile's shortlist.capacity, else the list's size
    live_check_every: int  # drafter calls between the engine's looks at the pointer; 0: no live swap
    live_off: str = ""  # why there is no live swap

    def describe(self) -> str:
        live = (f"live list swap on (the engine looks at the list pointer every {self.live_check_every} drafter calls)"
                if self.live_check_every else f"live list swap off: {self.live_off}")
        return f"shortlist draft head: capacity {self.capacity:,} rows, list {self.rows:,} ids; {live}"


def _live_swap_hook(version: str) -> bool:
    """Whether the pin's shortlist overlay takes a new list in the running engine (the overlays' compat table)."""
    from spark_overlays import compat

    try:
        return compat.support(version, "shortlist").live_swap
    except compat.CompatError:
        return False


def _shortlist_head(inv: Inventory, features: tuple[Feature, ...], tp: int) -> ShortlistHead | None:
    """None when the plan runs no shortlisted head; PlanError for a capacity the list, the model or the TP split
    cannot fit."""
    from spark_overlays.vocab_list import VOCAB_PADDING, VocabListError, rows_per_rank
    from sparkdeploy.model.served_tokenizer import known_vocab_size

    feat = next((f for f in features if f.name == "shortlist"), None)
    if feat is None or not (feat.enabled and feat.mode == "overlay") or inv.vocab is None:
        return None
    p = inv.profile
    size, capacity = inv.vocab.size, p.shortlist_capacity or inv.vocab.size
    if capacity < size:
        raise PlanError(f"{p.file}: shortlist.capacity {capacity:,} is smaller than the draft list {inv.vocab.path} "
                        f"({size:,} ids): raise it to at least {size:,}, or shorten the list")
    vocab_size = known_vocab_size(p.model_id)
    if vocab_size is not None and capacity > vocab_size:
        raise PlanError(f"{p.file}: shortlist.capacity {capacity:,} exceeds {p.model_id}'s vocabulary "
                        f"({vocab_size:,} tokens): lower it to at most {vocab_size:,}")
    try:
        rows_per_rank(capacity, tp)
    except VocabListError:
        raise PlanError(f"{p.file}: the shortlisted draft head's {capacity:,} rows, padded to a multiple of "
                        f"{VOCAB_PADDING} as vLLM pads them, do not split evenly over TP {tp} (vLLM refuses such a "
                        f"head): use a TP size that divides {VOCAB_PADDING} (parallel.tp), or serve without the "
                        "shortlist (inventory `patches: {shortlist: false}`)") from None
    live_off = ("" if _live_swap_hook(inv.image.vllm_version) else
                f"the shortlist overlay on vLLM {inv.image.vllm_version} has no live swap")
    if not live_off and not p.shortlist_live_check_every:
        live_off = "the profile sets no shortlist.live_check_every (a restart rollout swaps the list)"
    return ShortlistHead(size, capacity, 0 if live_off else p.shortlist_live_check_every, live_off)


def _additional_config(inv: Inventory, features: tuple[Feature, ...], capture: bool,
                       head: ShortlistHead | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    for feat in features:
        entry: dict[str, Any] = {"enabled": feat.enabled and feat.mode == "overlay"}
        if feat.name == "shortlist" and head is not None:
            entry.update(path=VOCAB_CONTAINER_FILE, sha256=inv.vocab.sha256)
            if inv.profile.shortlist_capacity:
                entry["capacity"] = head.capacity
            if head.live_check_every:
                entry["live_check_every"] = head.live_check_every
        cfg[feat.name] = entry
    if capture:
        cfg["capture"] = {"enabled": True, "path": inv.layout.capture_counts, "switch": inv.layout.capture_switch,
                          "flush_seconds": CAPTURE_FLUSH_S}
    return {"spark_overlays": cfg}


CAPTURE_FLUSH_S = 10  # a node's counts file lags the engine by at most this (and is flushed at `capture off`)


def _capture_wired(version: str, mode_of: Callable[[str, str], str]) -> bool:
    """Every release carries the capture overlay where the pinned vLLM supports it: `vocab capture on|off`
    then switches counting with a file, without the engine restart a flag change would cost."""
    try:
        return mode_of(version, "capture") == "overlay"
    except Exception:  # noqa: BLE001 - a pin (or test table) without the capture entry: not wired
        return False


def _speculative_config(profile, features: tuple[Feature, ...]) -> dict[str, Any] | None:
    """The profile's speculative config; with the shortlist overlay on, greedy drafts take the overlay's local
    argmax at any TP (`get_top_tokens`: 2 x TP values per token instead of the draft logits; at TP=1 the logits
    are never materialised). Not for the stock heads: vLLM 0.32's Qwen3NextMTP has no `get_top_tokens`.
    A profile that sets `use_local_argmax_reduction` or probabilistic drafting keeps its choice."""
    spec = profile.speculative.config()
    shortlist = next((f for f in features if f.name == "shortlist"), None)
    if spec and shortlist and shortlist.enabled and shortlist.mode == "overlay" \
            and spec.get("draft_sample_method") != "probabilistic":
        spec.setdefault("use_local_argmax_reduction", True)
    return spec


def _check_facts(node: Node, index: int, facts: NodeFacts) -> None:
    """The node's facts show its GPU, and every data link of it: the netdev, its address, its RoCE devices."""
    where = f"nodes[{index}]"
    if node.has_gpu and not facts.has_gpu:
        raise PlanError(f"{where}.gpu: node {node.name} is declared {node.gpu} but its facts show no GPU",
                        node=node.name)
    links = node.data_links()
    for li, link in enumerate(links):
        at, ip_field = (f"{where}.links[{li}].", "ip") if len(links) > 1 else (f"{where}.", "data_ip")
        if facts.netdevs:
            dev = facts.netdev(link.netdev)
            if dev is None:
                have = ", ".join(d.name for d in facts.netdevs)
                raise PlanError(f"{at}netdev: node {node.name} has no interface {link.netdev!r} (has: {have})",
                                node=node.name)
            if dev.ipv4 and link.ip not in dev.addresses():
                raise PlanError(f"{at}{ip_field}: {link.ip} is not on "
                                f"{node.name}'s {link.netdev} ({', '.join(dev.ipv4)})", node=node.name)
        if facts.roce:
            for i, hca in enumerate(link.hca):
                if facts.roce_dev(hca) is None:
                    have = ", ".join(d.name for d in facts.roce)
                    raise PlanError(f"{at}hca[{i}]: node {node.name} has no RoCE device {hca!r} (has: {have})",
                                    node=node.name)


def _gid_index(node: Node, facts: NodeFacts) -> tuple[int | None, str | None]:
    found = {hca: (facts.roce_dev(hca).gid_index if facts.roce_dev(hca) else None) for hca in node.hca}
    known = {v for v in found.values() if v is not None}
    if not known:
        return None, None
    if len(known) > 1 or None in found.values():
        detail = ", ".join(f"{k}={v}" for k, v in found.items())
        return None, f"{node.name}: RoCE v2 IPv4 GID index differs across HCAs ({detail}); NCCL_IB_GID_INDEX left unset"
    return known.pop(), None


def _env(inv: Inventory, node: Node, facts: NodeFacts, nnodes: int, ray: bool, notes: list[str]) -> dict[str, str]:
    env = dict(inv.profile.env)
    if ray:
        env.update(RAY_ADDRESS=_ray_address(inv), RAY_USAGE_STATS_ENABLED="0")
    if nnodes > 1:
        env.update(
            VLLM_HOST_IP=node.data_ip,
            NCCL_SOCKET_IFNAME=node.netdev,
            GLOO_SOCKET_IFNAME=node.netdev,
            TP_SOCKET_IFNAME=node.netdev,
        )
        if node.has_gpu:
            env.update(UCX_NET_DEVICES=node.netdev, NCCL_DEBUG="WARN", OMP_NUM_THREADS="4")
            if inv.profile.rdma and node.hca:
                env.update(NCCL_IB_HCA=",".join(node.hca), NCCL_IB_DISABLE="0")
                gid, note = _gid_index(node, facts)
                if gid is not None:
                    env["NCCL_IB_GID_INDEX"] = str(gid)
                if note:
                    notes.append(note)
            else:
                env["NCCL_IB_DISABLE"] = "1"
    return dict(sorted(env.items()))


def _serve_argv(inv: Inventory, node: Node, rank: int, nnodes: int, ray: bool, tp: int, pp: int, mem: MemoryBudget,
                head: Node, features: tuple[Feature, ...], flags_of: Callable[[str, str], list[str]],
                spec: dict[str, Any] | None, additional: dict[str, Any]) -> tuple[str, ...]:
    p = inv.profile
    argv = ["vllm", "serve", p.model_path, "--served-model-name", p.served_name]
    if rank == 0:
        argv += ["--host", "0.0.0.0", "--port", str(inv.ports.api)]
    if ray:
        argv += ["--distributed-executor-backend", "ray"]
    elif nnodes > 1:
        argv += ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", head.data_ip,
                 "--master-port", str(inv.ports.master)]
        if rank >= 1:
            argv.append("--headless")
    argv += ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        argv += ["--pipeline-parallel-size", str(pp)]
    if p.expert_parallel and tp * pp > 1:
        argv.append("--enable-expert-parallel")
    argv += ["--max-model-len", str(p.max_model_len)]
    if p.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(p.max_num_seqs)]
    if p.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(p.max_num_batched_tokens)]
    if p.kv_cache_dtype is not None:
        argv += ["--kv-cache-dtype", p.kv_cache_dtype]
    if mem.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{mem.gpu_memory_utilization:.2f}"]
    if p.enforce_eager:
        argv.append("--enforce-eager")
    argv += engine_args.switch(series(inv.image.vllm_version), "--enable-prefix-caching", p.prefix_caching)
    if spec is not None:
        argv += ["--speculative-config", _json(spec)]
    for feat in features:
        if feat.enabled and feat.mode == "native":
            flags = flags_of(inv.image.vllm_version, feat.name)
            i = 0
            while i < len(flags):  # skip a flag (and its value) already rendered
                flag = flags[i]
                takes_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
                chunk = flags[i:i + 2] if takes_value else flags[i:i + 1]
                if flag not in argv:
                    argv += chunk
                i += len(chunk)
    if "capture" in additional["spark_overlays"]:
        argv += ["--scheduler-cls", CAPTURE_SCHEDULER]
    argv += ["--additional-config", _json(additional)]
    return tuple(argv) + p.engine_args


def _ray_address(inv: Inventory) -> str:
    return f"{inv.head.data_ip}:{inv.ports.master}"


def _ray_start(inv: Inventory, node: Node, role: str) -> tuple[str, ...]:
    """`ray start` for one rank: on the data plane. A node without a GPU (the sim) declares the one rank it runs
    as a GPU resource, since vLLM's Ray executor places one worker per GPU; a GB10 node's GPU is detected."""
    argv = ["ray", "start", *(("--head", "--port", str(inv.ports.master), "--include-dashboard=false")
                              if role == "head" else ("--address", _ray_address(inv), "--block")),
            "--node-ip-address", node.data_ip, "--object-store-memory", str(RAY_OBJECT_STORE_BYTES),
            "--disable-usage-stats"]
    if not node.has_gpu:
        argv += ["--num-gpus", "1"]
    return tuple(argv)


def _docker_argv(inv: Inventory, node: Node, role: str, image_tag: str, serve_argv: tuple[str, ...],
                 capture: bool) -> tuple[str, ...]:
    p, lay = inv.profile, inv.layout
    argv = ["docker", "run", "--name", lay.container, "--init", "--stop-timeout", str(stop_timeout_s(role)),
            "--network", "host", "--ipc", "host"]
    if node.has_gpu and p.gpus:
        argv += ["--gpus", "all"]
    if node.has_gpu and p.rdma and node.hca:
        argv += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1"]
    argv += ["--ulimit", "stack=67108864", "--shm-size", p.shm_size,
             "--env-file", f"{lay.current_link}/{ENV_FILE}",
             # Always named, whether or not the inventory has a key: the key is current state (steps/secrets.py
             # keeps this file, empty without one), so any kept release starts, and runs with today's key.
             "--env-file", lay.secrets_env,
             "--label", f"io.sparkdeploy.release={_RELEASE_PLACEHOLDER}",
             "--label", f"io.sparkdeploy.node={node.name}",
             "--label", f"io.sparkdeploy.role={role}",
             "-v", f"{lay.vocab_host_dir}:{VOCAB_CONTAINER_DIR}:ro"]
    if capture:
        argv += ["-v", f"{lay.capture_dir}:{lay.capture_dir}"]
    if p.caches:
        for name, target in CACHE_MOUNTS:
            argv += ["-v", f"{CACHE_HOST_DIR}/{name}:{target}"]
    if p.host_dir:
        argv += ["-v", f"{p.host_dir}:{p.model_path}:ro"]
    argv.append(image_tag)
    return tuple(argv) + serve_argv


def _image(inv: Inventory, features: tuple[Feature, ...], git_commit: str, overlays_digest: str | None) -> ImageSpec:
    im = inv.image
    enabled = ",".join(f.name for f in features if f.requested)
    identity = _json({"base": im.base, "vllm": im.vllm_version, "python": im.python, "pip": im.pip,
                      "patches": enabled, "overlays": overlays_digest, "kit": __version__})
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    base_digest = im.base.split("@", 1)[1] if "@" in im.base else (im.base if im.base.startswith("sha256:") else "")
    labels = {
        "org.opencontainers.image.title": "sparkdeploy serving image",
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.revision": git_commit,
        "org.opencontainers.image.base.name": im.base,
        "org.opencontainers.image.base.digest": base_digest,
        "io.sparkdeploy.kit-version": __version__,
        "io.sparkdeploy.vllm-version": im.vllm_version,
        "io.sparkdeploy.patches": enabled,
        "io.sparkdeploy.overlays-digest": overlays_digest or "",
    }
    head = inv.head
    registry = f"{head.data_ip}:{REGISTRY_PORT}"

    transfers = (f"build: on {head.name} if its engine has the base, else on this machine; the head's registry "
                 f"https://{registry} holds every image a node had to be sent (pushed from the head's engine: no wire; from this machine: "
                 f"docker push through an SSH tunnel to {head.ssh.host}, the management address, the only path "
                 "this machine has; only layers the registry lacks)",
                 f"{head.name}: docker pull from its own registry (no wire)",
                 *(f"{head.name} -> {n.name}: docker pull from https://{registry} over {_plane(n)}; only the "
                   "layers the node lacks" for n in inv.nodes if n is not head))
    return ImageSpec(tag=f"{im.repository}:{im.vllm_version}-{digest}", repository=im.repository, base=im.base,
                     vllm_version=im.vllm_version, python=im.python, pip=im.pip, local_base=im.local,
                     vocab_source=str(inv.vocab.path) if inv.vocab else None, labels=dict(sorted(labels.items())),
                     registry=registry, transfers=transfers)


def _plane(node: Node) -> str:
    return (f"data plane {node.data_ip} ({node.netdev})" if node.data_ip != node.ssh.host
            else f"{node.data_ip} ({node.netdev}), the SSH address too: no separate data plane")


def _weights_transfers(inv: Inventory, nodes: tuple[Node, ...]) -> tuple[str, ...]:
    """Which path the checkpoint's bytes take (printed by `plan`; not part of the release)."""
    p, head = inv.profile, inv.head
    if not p.host_dir:
        return (f"none by the kit: {p.model_path} is in the image or the engine fetches {p.model_id} itself",)
    return (f"fetch: `sparkdeploy weights fetch` downloads {p.model_id} once, on {head.name} (its own internet "
            f"path), into its Hugging Face cache, hard-linked into {p.host_dir}",
            *(f"{head.name} -> {n.name}: `sparkdeploy weights sync`, rsync run on {head.name} over {_plane(n)}; "
              "only the files that differ" for n in nodes if n is not head))


def node_layout(inv: Inventory, nodes: int | None) -> tuple[tuple[Node, ...], int, int]:
    """(the nodes that take part, head first; tp; pp) for `--nodes` (None: all of the inventory)."""
    p, all_nodes = inv.profile, inv.nodes
    asked = len(all_nodes) if nodes is None else nodes
    if asked < 1:
        raise PlanError(f"--nodes: {asked} is not a node count (1..{len(all_nodes)})")
    if asked == p.world_size:
        chosen, tp, pp = all_nodes, p.tp, p.pp
    elif asked == 1:
        chosen, tp, pp = (inv.head,), 1, 1
    else:
        raise PlanError(f"--nodes {asked}: profile {p.name!r} is laid out for tp x pp x dp = {p.world_size} "
                        f"node(s); plan 1 (single box) or {p.world_size}, or use a profile for {asked}")
    if p.dp > 1 and asked > 1:
        raise PlanError(f"profile {p.name!r}: data parallel (dp={p.dp}) layouts are not planned yet")
    head_first = (inv.head,) + tuple(n for n in chosen if n.role != "head")
    return head_first, tp, pp


def _each_node(nodes: tuple[Node, ...], budget_of: Callable[[Node], MemoryBudget]) -> dict[str, MemoryBudget]:
    """Every node's budget; where some do not fit, one refusal naming each of them with its own shortfall (a 64 GB
    box beside a 128 GB one falls short alone, and a pair of them each by its own amount)."""
    budgets, refused = {}, []
    for node in nodes:
        try:
            budgets[node.name] = budget_of(node)
        except BudgetError as err:
            refused.append(err)
    if len(refused) == 1:
        raise refused[0]
    if refused:
        raise BudgetError(f"{len(refused)} nodes do not fit:\n  " + "\n  ".join(map(str, refused)))
    return budgets


def plan(inventory: Inventory, facts_by_node: Mapping[str, NodeFacts] | None = None, nodes: int | None = None,
         *, git_commit: str = "unknown", overlays_digest: str | None = None,
         compat: tuple[Callable[[str, str], str], Callable[[str, str], list[str]]] | None = None,
         checkpoint: Checkpoint | None = None) -> Plan:
    """Plan `nodes` nodes (default: all) of `inventory`; facts missing for a node default to nominal ones.

    `checkpoint` is what the head's checkpoint files say (else the profile's `checkpoint.format`);
    `git_commit` and `overlays_digest` only feed image provenance; `compat` replaces the overlays table (tests).
    """
    inv, p = inventory, inventory.profile
    chosen, tp, pp = node_layout(inv, nodes)
    nnodes = len(chosen)
    ray = inv.backend == "ray" and nnodes > 1  # one box needs no Ray: plain vLLM
    facts = facts_for(chosen, facts_by_node)
    mode_of, flags_of = compat or _compat_mode()
    ckpt = _checkpoint(p, checkpoint)
    features = _features(inv, mode_of, ckpt)
    secrets = inv.auth.fingerprints()
    capture = _capture_wired(inv.image.vllm_version, mode_of)
    shortlist = _shortlist_head(inv, features, tp)
    additional = _additional_config(inv, features, capture, shortlist)
    spec = _speculative_config(p, features)
    image = _image(inv, features, git_commit, overlays_digest)
    head = chosen[0]
    scale = tp * pp
    weights = p.weights_gib / scale
    kv_bytes = p.kv_bytes_per_token * p.tp * p.pp // scale if p.kv_bytes_per_token else 0
    cpu_kv = dict(p.env).get("VLLM_CPU_KVCACHE_SPACE")
    notes: list[str] = []

    def node_budget(node: Node, gmu: float | None) -> MemoryBudget:
        try:
            return budget(facts[node.name], reserve_gib=inv.memory.reserve_gib, weights_gib=weights,
                          activation_gib=p.activation_gib, kv_bytes_per_token=kv_bytes, explicit_gmu=gmu,
                          cpu_kv_space_gib=float(cpu_kv) if cpu_kv and cpu_kv.replace(".", "", 1).isdigit() else None,
                          draft_head_gib=shortlist_head_gib(shortlist.capacity if shortlist else 0, tp),
                          shared_by=inv.shared_by(node.name), min_kv_gib=p.max_model_len * kv_bytes / GIB)
        except BudgetError as err:
            if inv.service is None:
                raise
            raise BudgetError(f"service {inv.service} (services[{inv.services.index(inv.service)}]): {err}",
                              node=err.node) from None

    for node in chosen:
        _check_facts(node, inv.nodes.index(node), facts[node.name])
    budgets = _each_node(chosen, lambda n: node_budget(n, inv.memory.gpu_memory_utilization))
    derived = [b.gpu_memory_utilization for b in budgets.values() if b.gmu_source == "derived"]
    if len(derived) > 1 and len(set(derived)) > 1:
        # One fraction for every rank (vLLM sizes the KV pool by the smallest rank anyway): the lowest wins.
        lowest = min(derived)
        budgets = {name: dataclasses.replace(b, gmu_source="derived")
                   for name, b in _each_node(chosen, lambda n: node_budget(n, lowest)).items()}

    node_plans = []
    for rank, node in enumerate(chosen):
        nf = facts[node.name]
        mem = budgets[node.name]
        if nf.source == "nominal":
            notes.append(f"{node.name}: nominal {'GB10' if node.has_gpu else 'simulated'} facts (nothing measured)")
        netdev = nf.netdev(node.netdev)
        if node.has_gpu and nnodes > 1 and netdev is not None and netdev.mtu is not None and netdev.mtu < 9000:
            notes.append(f"{node.name}: {node.netdev} MTU {netdev.mtu} (CX-7 links want 9000)")
        role = "head" if rank == 0 else "worker"
        env = _env(inv, node, nf, nnodes, ray, notes)
        if ray and rank > 0:  # the worker's rank is a Ray actor the head's vLLM places: no vLLM of its own
            serve = command = _ray_start(inv, node, role)
        else:
            serve = _serve_argv(inv, node, rank, nnodes, ray, tp, pp, mem, head, features, flags_of, spec,
                                additional)
            # a ray head starts Ray's head first; the shell execs vLLM, so the container ends with it
            command = (("sh", "-c", f'{shlex.join(_ray_start(inv, node, role))} && exec "$@"', "ray-head") + serve
                       if ray else serve)
        docker = _docker_argv(inv, node, role, image.tag, command, capture)
        files = {f"{node.name}/release/{name}": f"{{release}}/{name}" for name in (ENV_FILE, LAUNCH_FILE, NODE_PLAN_FILE)}
        files[f"{node.name}/unit/{inv.layout.unit}"] = inv.layout.unit_path
        start_order = nnodes - 1 if rank == 0 else rank - 1
        node_plans.append(NodePlan(node.name, role, rank, start_order, node.ssh, node.data_ip, node.netdev, node.hca,
                                   serve, docker, env, mem, files, inv.layout.container, inv.layout.unit))
    for feat in features:
        if feat.requested and not feat.enabled:
            notes.append(f"patch {feat.name} off: {feat.reason}")
    if shortlist is not None:
        notes.append(shortlist.describe())

    draft = Plan(cluster=inv.cluster, release_id=_RELEASE_PLACEHOLDER, kit_version=__version__, profile=p.name,
                 nnodes=nnodes, tp=tp, pp=pp, api_port=inv.ports.api, master_port=inv.ports.master, image=image,
                 nodes=tuple(node_plans), features=features, additional_config=additional, capture=capture,
                 speculative_config=spec, model_host_dir=p.host_dir, notes=tuple(notes), checkpoint=ckpt,
                 secrets=secrets, weights_transfers=_weights_transfers(inv, chosen), metrics_port=inv.ports.metrics,
                 service=inv.service, backend="ray" if ray else "mp")
    identity = draft.to_dict()  # what reaches the nodes; not provenance, host paths or how we log in
    identity["image"] = {k: v for k, v in identity["image"].items() if k not in ("labels", "vocab_source", "transfers")}
    identity.pop("notes")
    identity.pop("metrics_port")
    identity.pop("service")  # a name; the cluster name the units show already carries it
    identity.pop("backend")  # the ranks' commands carry it
    identity.pop("weights_transfers")
    for raw in identity["nodes"]:
        raw.pop("ssh")
    release_id = hashlib.sha256(_json(identity).encode()).hexdigest()[:12]
    return _substitute(draft, release_id)


def _substitute(draft: Plan, release_id: str) -> Plan:
    def fix(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(_RELEASE_PLACEHOLDER, release_id)
        if isinstance(value, tuple):
            return tuple(fix(v) for v in value)
        return value

    nodes = tuple(dataclasses.replace(n, docker_argv=fix(n.docker_argv)) for n in draft.nodes)
    return dataclasses.replace(draft, release_id=release_id, nodes=nodes)
