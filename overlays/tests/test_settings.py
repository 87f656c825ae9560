import pytest

from spark_overlays import settings as S


def test_defaults_are_off():
    cfg = S.parse({})
    assert not any(getattr(cfg, f).enabled for f in ("shortlist", "skinny_gemm", "fp8_gdn", "prefix_align"))
    assert S.parse(None) == cfg


def test_full_schema_round_trip():
    raw = S.additional_config(
        shortlist={"enabled": True, "path": "/opt/sparkdeploy/vocab/current.txt", "sha256": "ab" * 32,
                   "require_ids": [0, 2], "capacity": 65536, "live_check_every": 64},
        skinny_gemm={"enabled": True}, fp8_gdn={"enabled": False}, prefix_align={"enabled": False})
    cfg = S.parse(raw)
    assert cfg.shortlist.enabled and cfg.shortlist.require_ids == (0, 2)
    assert (cfg.shortlist.capacity, cfg.shortlist.live_check_every) == (65536, 64)
    assert not cfg.prefix_align.enabled and not cfg.fp8_gdn.enabled


@pytest.mark.parametrize("raw, where", [
    ({"spark_overlays": {"shortlst": {}}}, "spark_overlays.shortlst"),
    ({"spark_overlays": {"shortlist": {"enabled": True, "pth": "x"}}}, "shortlist.pth"),
    ({"spark_overlays": {"shortlist": {"enabled": True}}}, "shortlist.path"),
    ({"spark_overlays": {"skinny_gemm": {"enabled": "yes"}}}, "skinny_gemm.enabled"),
    ({"spark_overlays": {"prefix_align": {"lookahead": 2}}}, "prefix_align.lookahead"),  # removed with the overlay
    ({"spark_overlays": {"shortlist": {"require_ids": [-1]}}}, "require_ids"),
    ({"spark_overlays": {"shortlist": {"capacity": -1}}}, "shortlist.capacity"),
    ({"spark_overlays": {"shortlist": {"live_check_every": True}}}, "shortlist.live_check_every"),
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
    # forced: the probes need a vLLM to read, and this test is about the settings alone
    good = {"spark_overlays": {"skinny_gemm": {"enabled": True, "force": True}, "prefix_align": {"enabled": False}}}
    assert S.switched_on(good, "skinny_gemm") == S.SkinnyGemm(enabled=True, force=True)
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


def test_a_probed_feature_stays_off_when_its_probes_are_unproven_unless_forced(monkeypatch):
    """Fail closed: with no vLLM this Python can read, nothing is proven, so the shortlist is off unless forced."""
    from spark_overlays import check, probes, settings

    def no_vllm(source=None):
        raise check.CheckError("vllm is not installed in this Python")

    monkeypatch.setattr(check, "find_vllm_root", no_vllm)
    monkeypatch.setattr(probes, "_installed", {})
    on = {"enabled": True, "path": "/l.txt"}
    assert settings.switched_on({"spark_overlays": {"shortlist": on}}, "shortlist") is None
    assert "unproven" in probes.installed_gate("shortlist", force=False)
    forced = settings.switched_on({"spark_overlays": {"shortlist": {**on, "force": True}}}, "shortlist")
    assert forced is not None and forced.force
    monkeypatch.setattr(probes, "_installed", {"shortlist": [probes.Verdict("shortlist", "p", probes.DRIFT, "x")]})
    assert settings.switched_on({"spark_overlays": {"shortlist": {**on, "force": True}}}, "shortlist") is None


def test_a_probed_feature_runs_where_the_probes_pass(monkeypatch):
    import os
    from pathlib import Path

    from spark_overlays import check, probes, settings

    src = os.environ.get("SPARKDEPLOY_VLLM034_SOURCE", "/opt/sparkdeploy/vllm-0.34.0-src")
    if not Path(src, "vllm", "__init__.py").is_file():
        pytest.skip("vLLM 0.34.0 source not unpacked (scripts/setup.sh)")
    monkeypatch.setattr(check, "find_vllm_root", lambda source=None: Path(src, "vllm"))
    monkeypatch.setattr(probes, "_installed", {})
    cfg = settings.switched_on({"spark_overlays": {"shortlist": {"enabled": True, "path": "/l.txt"}}}, "shortlist")
    assert cfg is not None and not cfg.force
