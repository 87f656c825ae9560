"""One stale-unit rule: `up` disables, health fails and doctor reports the same units (`probes.stale_units`)."""

from __future__ import annotations

from sparkdeploy.checks import preflight as pf
from sparkdeploy.node import probes
from sparkdeploy.steps import stale
from sparkdeploy.verdict import Status
from tests.unit.test_doctor import HEALTHY, SPEC, facts, render

OTHERS = ("ExecStart={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m sglang.launch_server --port 30000 }\n"
          "Id=sglang.service\n\n"
          "ExecStart={ path=/usr/local/bin/llama-server ; argv[]=/usr/local/bin/llama-server -m /m.gguf }\n"
          "Id=llama.service\n\n"
          "ExecStart={ path=/usr/bin/docker ; argv[]=/usr/bin/docker run -p 8000:8000 api ; pid=8000 }\n"
          "Id=api.service\n\n"
          "ExecStart={ path=/usr/bin/nginx ; argv[]=/usr/bin/nginx -g daemon off; ; pid=8000 }\nId=web.service\n")


def test_up_health_and_doctor_judge_stale_units_by_one_rule():
    """Doctor flagged an enabled sglang or llama-server unit and said `up` would disable it, while `up` (and
    health) judged with a shell rule of their own that looked only for vLLM and our ports: `up` left them. Both
    now read doctor's section with one rule; `up` adds the units that own a listener on our ports."""
    units = HEALTHY["enabled_units"] + "\n" + OTHERS
    sections = probes.split_sections(render({"enabled_units": units,
                                             "port_owners": "user-api.service\nsparkdeploy-engine.service\n"}))
    ours = ["sparkdeploy-engine.service", "sparkdeploy-watchdog.service"]
    assert stale.parse(sections, ours, [8000, 29501]) == ["api.service", "llama.service", "sglang.service",
                                                          "user-api.service"]
    doctor = pf.check_stale_units(SPEC, facts(enabled_units=units), ports=(8000, 29501))
    assert doctor.status is Status.FAILED
    assert doctor.reason.endswith("another inference stack: api.service, llama.service, sglang.service")


def test_up_and_health_read_doctors_section():
    assert stale.SECTIONS["enabled_units"] == probes.SECTIONS["enabled_units"]
    assert probes.GATHER_SECTIONS["enabled_units"] == probes.SECTIONS["enabled_units"]
