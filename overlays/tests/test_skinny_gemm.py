import pytest

from spark_overlays import compat, skinny_plans as P

GB10 = (12, 1)


def test_every_plan_is_valid_for_its_shape():
    for cap, table in P.PLANS.items():
        for (n, k), by_m in table.items():
            for m, plan in by_m.items():
                assert plan.valid_for(n, k), (cap, n, k, m)


def test_measured_entries_are_marked_and_counted():
    assert P.SM121[(248320, 2560)][4].measured and not P.SM121[(248320, 2560)][3].measured
    c = P.counts()
    assert c == {"entries": 40, "measured": 23}
    assert "17 of 40" in compat.support("0.33.0", "skinny_gemm").note  # plan shows how many are guesses


@pytest.mark.parametrize("rows", [65536, 32768, 47168, 26400, 23584, 16000, 8001])
def test_an_lm_head_of_any_size_gets_a_generic_unmeasured_plan(rows):
    by_m = P.plans_for(GB10, rows, 2560, lm_head=True)
    assert sorted(by_m) == [1, 2, 3, 4, 5]
    assert all(p.valid_for(rows, 2560) and not p.measured for p in by_m.values())
    assert P.plans_for(GB10, rows, 2560, lm_head=False) == {}  # a linear layer needs a table entry


def test_table_entries_win_over_generic():
    assert P.plans_for(GB10, 16384, 2560, lm_head=True) == P.SM121[(16384, 2560)]


@pytest.mark.parametrize("cap, n, k", [(None, 248320, 2560), ((9, 0), 248320, 2560), (GB10, 100, 2560)])
def test_no_plan(cap, n, k):
    assert P.plans_for(cap, n, k) == {}


def test_invalid_plan_is_dropped():
    bad = {GB10: {(100, 2560): {1: P.Plan(128, 3), 2: P.Plan(64, 2)}}}  # 100 % 3 != 0
    assert P.plans_for(GB10, 100, 2560, plans=bad) == {2: P.Plan(64, 2)}


torch = pytest.importorskip("torch")


def test_check_keeps_what_passes_and_names_what_fails():
    from spark_overlays import skinny_gemm as S

    F = torch.nn.functional
    w = torch.randn(96, 256)
    plans = {m: P.Plan(32, 1) for m in (1, 2, 3)}

    def run(x, weight, m, plan):
        if m == 2:
            raise RuntimeError("does not compile")
        return F.linear(x, weight) * (2.0 if m == 3 else 1.0)

    passed, failed = S.check({(96, 256): (w, plans)}, run)
    assert passed == {(96, 256): {1: plans[1]}}
    assert failed[0] == "(96, 256) M=2: RuntimeError: does not compile"
    assert failed[1].startswith("(96, 256) M=3: max relative error")


def _pin_plan_module(monkeypatch):
    """vLLM 0.34.0's own skinny_gemm_plans module (its SkinnyGemmConfig; the kernel import stubbed, device GB10)."""
    import os
    import sys
    import types
    from pathlib import Path

    from spark_overlays import check, probes

    src = os.environ.get("SPARKDEPLOY_VLLM034_SOURCE", "/opt/sparkdeploy/vllm-0.34.0-src")
    if not Path(src, "vllm", "__init__.py").is_file():
        pytest.skip("vLLM 0.34.0 source not unpacked (scripts/setup.sh)")
    module = types.ModuleType("pin_skinny_gemm_plans")
    module.__dict__.update(probes.load_plan_table(check.Source(check.find_vllm_root(src))))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


@pytest.mark.parametrize("plans, measured", [("auto", frozenset()), ("auto", frozenset({(248320, 2560, 3)})),
                                             ("all", None)])
def test_on_034_our_entries_go_into_the_pins_table(monkeypatch, plans, measured):
    """``auto`` adds only what was measured under 0.34's rule (none shipped yet), ``all`` every entry; upstream's
    own entries always stay."""
    from spark_overlays import probes as probes_mod
    from spark_overlays import skinny_gemm

    pin = _pin_plan_module(monkeypatch)
    if measured is not None:
        monkeypatch.setattr(P, "MEASURED_034", measured)
    theirs = {shape: dict(by_m) for shape, by_m in pin.SM121_SKINNY_GEMM_PLANS.items()}
    monkeypatch.setattr(probes_mod, "installed_gate", lambda feature, force: "")  # the probes run in test_check
    cfg = type("Cfg", (), {"additional_config": {"spark_overlays": {"skinny_gemm": {"enabled": True, "plans": plans}}}})
    added = skinny_gemm.extend_pin_table(cfg, pin.__name__)
    want = [(n, k, m) for (n, k), by_m in P.SM121.items() for m in sorted(by_m) if measured is None or (n, k, m) in measured]
    assert added == want
    for shape, by_m in theirs.items():  # upstream's measured entries are never replaced
        assert all(pin.get_skinny_gemm_plan(*shape)[m] is cfg_ for m, cfg_ in by_m.items())
    got = pin.get_skinny_gemm_plan(248320, 2560) or {}
    assert sorted(got) == {None: [1, 2, 3, 4, 5], frozenset(): []}.get(measured, [3])
    if 3 in got:
        assert (got[3].num_rows, got[3].block_size, got[3].vector_width, got[3].static_k) == (3, 32, 4, 2560)


def test_on_034_switched_off_adds_nothing(monkeypatch):
    from spark_overlays import skinny_gemm

    pin = _pin_plan_module(monkeypatch)
    cfg = type("Cfg", (), {"additional_config": {}})
    assert skinny_gemm.extend_pin_table(cfg, pin.__name__) == []
    assert pin.get_skinny_gemm_plan(248320, 2560) is None
