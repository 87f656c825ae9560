import pytest

from spark_overlays import skinny_plans as P

GB10 = (12, 1)


def test_plans_cover_m_1_to_5_for_lm_head_shortlist_and_gdn():
    for n, k in [(248320, 2560), (124160, 2560), (65536, 2560), (32768, 2560), (16384, 2560), (8192, 2560),
                 (96, 2560), (48, 2560), (2560, 6144), (2560, 3072)]:
        for m in range(1, 6):
            assert P.lookup(GB10, n, k, m) is not None, (n, k, m)


def test_every_plan_is_valid_for_its_shape():
    for cap, table in P.PLANS.items():
        for (n, k), by_m in table.items():
            for m, plan in by_m.items():
                assert plan.valid_for(n, k), (cap, n, k, m)


def test_lookup_picks_the_planned_config():
    assert P.lookup(GB10, 248320, 2560, 1) == P.SM121[(248320, 2560)][1]
    assert P.lookup(GB10, 248320, 2560, 3).source == "seed"
    assert P.lookup(GB10, 248320, 2560, 4).source == "qwen4_exp"


@pytest.mark.parametrize("cap, n, k, m", [
    (None, 248320, 2560, 1),        # CPU
    ((9, 0), 248320, 2560, 1),      # a device without plans
    (GB10, 248320, 2560, 6),        # M without a plan
    (GB10, 248321, 2560, 1),        # shape without a plan
    (GB10, 248320, 2048, 1),
])
def test_lookup_falls_back(cap, n, k, m):
    assert P.lookup(cap, n, k, m) is None


def test_invalid_plan_falls_back():
    bad = {GB10: {(100, 2560): {1: P.Plan(128, 3)}}}  # 100 % 3 != 0
    assert P.lookup(GB10, 100, 2560, 1, bad) is None


torch = pytest.importorskip("torch")


def test_dispatcher_select_and_cpu_fallback():
    from spark_overlays import skinny_gemm as S

    x = torch.randn(3, 2560, dtype=torch.bfloat16)
    w = torch.randn(96, 2560, dtype=torch.bfloat16)
    assert S.select(x, w, GB10) == P.SM121[(96, 2560)][3]
    assert S.select(x.float(), w.float(), GB10) is None          # not BF16
    assert S.select(x, w, None) is None                           # no device plans
    assert S.select(torch.randn(7, 2560, dtype=torch.bfloat16), w, GB10) is None  # M=7 unplanned
    assert S.select(x[:, :2048], w[:, :2048], GB10) is None       # K without a plan
    # the op body on CPU tensors is exactly F.linear
    assert torch.equal(S.skinny_gemm(x, w), torch.nn.functional.linear(x, w))
    assert S._fake(x, w).shape == (3, 96)
