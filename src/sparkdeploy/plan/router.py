"""The router's plan (no I/O): which node runs vLLM's router, on what port, and which engine serves each model.

vLLM's router (`vllm-router`, its Rust core `vllm_router_rs`) in inference-gateway mode sends each request to
a worker registered for the request's `model`, round robin among several (a service's replicas); the workers are
the services' heads (their API on the data-plane address), registered with their served model name. Clients
reach the router on the node's SSH address (the network they reach the nodes on). steps/router.py installs and
supervises it; ops/rotation.py takes a replica out of its rotation while the replica restarts.
In front of it, on the router's port, the launcher answers `/v1/models` as OpenAI lists models and a request
for a model no service serves with OpenAI's 404 (the router core lists `{"models": [...]}` and sends an unknown
model to any worker); everything else, streams included, it passes to the core on loopback.

Why these health settings: the router's defaults (a check every 60 s, 3 failures) keep a dead engine in its
rotation for about three minutes; every 5 s with 2 failures it is out in about 10 s. Its circuit breaker takes
a worker out sooner, after 5 failed requests, and tries it again after 30 s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkdeploy.model import topology
from sparkdeploy.model.inventory import Inventory, Node
from sparkdeploy.node import layout

ROUTER_VERSION = "0.1.17"  # the vllm-router wheel: manylinux_2_28, x86_64 and aarch64, abi3 (CPython >= 3.8)
HEALTH = {"interval_s": 5, "timeout_s": 5, "failures": 2, "successes": 1}
REQUEST_TIMEOUT_S = 1800  # a long generation through the router must not be cut before the engine finishes


@dataclass(frozen=True)
class Worker:
    service: str
    model: str
    url: str  # the service head's API on its data-plane address
    key: str  # the view it serves: the service, or `NAME/R` for a replica (`Inventory.key`)


@dataclass(frozen=True)
class RouterPlan:
    node: Node
    port: int
    workers: tuple[Worker, ...]

    @property
    def url(self) -> str:
        return f"http://{self.node.ssh.host}:{self.port}"

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(w.model for w in self.workers))

    def to_dict(self) -> dict:
        return {"node": self.node.name, "url": self.url, "version": ROUTER_VERSION, "unit": layout.ROUTER_UNIT,
                "workers": [{"service": w.key, "model": w.model, "url": w.url} for w in self.workers]}

    def config(self) -> bytes:
        """The launcher's config (node/scripts/router_launcher.py), stable bytes: a change means a restart."""
        cfg = {"host": "0.0.0.0", "port": self.port, "core_port": layout.ROUTER_CORE_PORT,
               "key_check_port": layout.ROUTER_KEY_CHECK_PORT,
               "metrics_port": layout.ROUTER_METRICS_PORT, "request_timeout_s": REQUEST_TIMEOUT_S,
               "health": HEALTH, "workers": [{"url": w.url, "model_id": w.model} for w in self.workers],
               "models": [{"id": m, "owned_by": next(w.service for w in self.workers if w.model == m)}
                          for m in self.models]}
        return (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()


def unit(rp: RouterPlan) -> bytes:
    from sparkdeploy import __version__
    from sparkdeploy.plan.render import environment

    return environment().get_template(f"systemd/{layout.ROUTER_UNIT}.j2").render(
        kit_version=__version__, version=ROUTER_VERSION, port=rp.port, models=", ".join(rp.models),
        secrets=layout.ROUTER_SECRETS, code_dir=layout.ROUTER_DIR, config=layout.ROUTER_CONFIG).encode()


def router_files(rp: RouterPlan) -> dict[str, bytes]:
    """What `render` writes for the router (DIR/router/...) and `up` installs (steps/router.py)."""
    return {layout.ROUTER_UNIT: unit(rp), "router.json": rp.config()}


def _head_address(router_node: Node, head: Node) -> str:
    """Where the router reaches a service's head (its API listens on every interface): the service's data address
    when the router's node is on that subnet (a pair, a switch), else a link of the head on a subnet the router's
    node shares (a ring), else the head's SSH address (the management network)."""
    if router_node.name == head.name:
        return head.data_ip
    return topology.address_for(router_node, head, head.data_ip) or head.ssh.host


def plan_router(views: tuple[Inventory, ...]) -> RouterPlan | None:
    """The router of an inventory's services (None without `router:`)."""
    cfg = views[0].router
    if cfg is None:
        return None
    workers = tuple(Worker(str(v.service), v.profile.served_name, f"http://{_head_address(cfg.node, v.head)}:"
                           f"{v.ports.api}", str(v.key)) for v in views)
    return RouterPlan(node=cfg.node, port=cfg.port, workers=workers)
