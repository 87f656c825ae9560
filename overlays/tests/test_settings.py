import pytest

from spark_overlays import settings as S


def test_defaults_are_off():
    cfg = S.parse({})
    assert not any(getattr(cfg, f).enabled for f in ("shortlist", "skinny_gemm", "fp8_gdn", "prefix_align"))
    assert S.parse(None) == cfg


def test_full_schema_round_trip():
    raw = S.additional_config(
        shortlist={"enabled": True, "path": "/opt/sparkdeploy/vocab/current.txt", "sha256": "ab" * 32,
                   "require_ids": [0, 2]},
        skinny_gemm={"enabled": True}, fp8_gdn={"enabled": False}, prefix_align={"enabled": False})
    cfg = S.parse(raw)
    assert cfg.shortlist.enabled and cfg.shortlist.require_ids == (0, 2)
    assert not cfg.prefix_align.enabled and not cfg.fp8_gdn.enabled


@pytest.mark.parametrize("raw, where", [
    ({"spark_overlays": {"shortlst": {}}}, "spark_overlays.shortlst"),
    ({"spark_overlays": {"shortlist": {"enabled": True, "pth": "x"}}}, "shortlist.pth"),
    ({"spark_overlays": {"shortlist": {"enabled": True}}}, "shortlist.path"),
    ({"spark_overlays": {"skinny_gemm": {"enabled": "yes"}}}, "skinny_gemm.enabled"),
    ({"spark_overlays": {"prefix_align": {"lookahead": 2}}}, "prefix_align.lookahead"),  # removed with the overlay
    ({"spark_overlays": {"shortlist": {"require_ids": [-1]}}}, "require_ids"),
    ({"spark_overlays": []}, "spark_overlays"),
])
def test_errors_name_the_key(raw, where):
    with pytest.raises(S.SettingsError, match=where.replace(".", r"\.")):
        S.parse(raw)


def test_other_features_unaffected_by_one_bad_feature():
    raw = {"spark_overlays": {"shortlist": {"enabled": True, "pth": "x"}, "skinny_gemm": {"enabled": True}}}
    assert S.parse_feature(raw, "skinny_gemm").enabled
    with pytest.raises(S.SettingsError):
        S.parse_feature(raw, "shortlist")


def test_switched_on_fails_closed_on_a_bad_setting(caplog):
    good = {"spark_overlays": {"skinny_gemm": {"enabled": True}, "prefix_align": {"enabled": False}}}
    assert S.switched_on(good, "skinny_gemm") == S.SkinnyGemm(enabled=True)
    assert S.switched_on(good, "prefix_align") is None  # off
    assert S.switched_on(None, "fp8_gdn") is None  # no config: every feature off
    with caplog.at_level("WARNING", logger="vllm.spark_overlays"):
        assert S.switched_on({"spark_overlays": {"fp8_gdn": {"enabled": "yes"}}}, "fp8_gdn") is None
    assert "fp8_gdn DISABLED" in caplog.text and "fp8_gdn.enabled" in caplog.text


def test_skinny_plans_setting_is_auto_or_all():
    from spark_overlays import settings

    assert settings.parse_feature({}, "skinny_gemm").plans == "auto"
    cfg = {"spark_overlays": {"skinny_gemm": {"enabled": True, "plans": "some"}}}
    with pytest.raises(settings.SettingsError, match="skinny_gemm.plans must be 'auto'"):
        settings.parse_feature(cfg, "skinny_gemm")
