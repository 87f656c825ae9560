"""plan(): pure (Inventory, facts) -> Plan on the shipped inventory and the simulated example."""

from __future__ import annotations

from sparkdeploy import inventory, paths, plan


def _shipped():
    return inventory.load(paths.default_inventory())


def test_two_node_plan_is_mp_multinode_workers_first():
    p = plan.plan(_shipped())
    head, worker = p.nodes
    assert (head.role, head.rank, worker.role, worker.rank) == ("head", 0, "worker", 1)
    assert [n.name for n in p.start_order] == ["spark2", "spark1"]
    assert "--headless" in worker.serve_argv and "--headless" not in head.serve_argv
    assert "--port" in head.serve_argv and "--port" not in worker.serve_argv
    for n in p.nodes:
        argv = n.serve_argv
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--master-addr") + 1] == head.data_ip
        assert "--enable-expert-parallel" in argv
        assert n.docker_argv[:2] == ("docker", "run") and "--rm" not in n.docker_argv
        assert n.docker_argv[-len(argv):] == argv


def test_single_node_plan_has_no_multinode_flags():
    p = plan.plan(_shipped(), nodes=1)
    (only,) = p.nodes
    assert only.role == "head" and p.tp == 1
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--headless", "--enable-expert-parallel"):
        assert flag not in only.serve_argv
    assert "NCCL_IB_HCA" not in only.env


def test_plan_is_deterministic():
    inv = _shipped()
    assert plan.plan(inv) == plan.plan(inv)
    assert plan.plan(inv).release_id == plan.plan(inv).release_id
