"""tests/support/vllm_server.py without vLLM: a fake 'python' that serves /health, with a child process."""

import os
import stat
import sys
import time

import pytest

from tests.support import vllm_server as vs

FAKE = r'''#!{python}
import http.server, os, subprocess, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("FAKE_MODE", "ok")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["FAKE_PIDS"], "w").write(f"{{os.getpid()}} {{child.pid}}")
print("fake vllm starting", flush=True)
if mode == "die":
    sys.exit(3)
if mode == "slow":
    time.sleep(600)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_python(tmp_path):
    p = tmp_path / "python"
    p.write_text(FAKE.format(python=sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_start_health_and_stop_kills_the_process_group(fake_python, tmp_path):
    pids = tmp_path / "pids"
    srv = vs.VllmServer("/m", env={"FAKE_PIDS": str(pids)}, python=fake_python, log_path=tmp_path / "log", timeout=30)
    with srv:
        assert srv.request("/health") == ""
        assert "fake vllm starting" in srv.log_text()
        assert "--port" in srv.command() and "/m" in srv.command()
        leader, child = map(int, pids.read_text().split())
    deadline = time.time() + 10
    while time.time() < deadline and (_alive(leader) or _alive(child)):
        time.sleep(0.1)
    assert not _alive(leader) and not _alive(child)


def test_died_before_healthy_reports_log_and_reaps_orphans(fake_python, tmp_path):
    pids = tmp_path / "p"
    srv = vs.VllmServer("/m", env={"FAKE_PIDS": str(pids), "FAKE_MODE": "die"}, python=fake_python,
                        log_path=tmp_path / "log", timeout=30)
    with pytest.raises(vs.ServerError, match="(?s)exited with code 3.*fake vllm starting"):
        srv.start()
    _, child = map(int, pids.read_text().split())
    deadline = time.time() + 10
    while time.time() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)  # the leader died first; its child must not be left behind


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_timeout_names_last_state_and_cleans_up(fake_python, tmp_path):
    pids = tmp_path / "p"
    srv = vs.VllmServer("/m", env={"FAKE_PIDS": str(pids), "FAKE_MODE": "slow"}, python=fake_python,
                        log_path=tmp_path / "log", timeout=3)
    with pytest.raises(vs.ServerError, match="not healthy after 3 s"):
        srv.start()
    leader, child = map(int, pids.read_text().split())
    time.sleep(0.5)
    assert not _alive(leader) and not _alive(child)


def test_require_venv_skips_with_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKDEPLOY_VLLM_VENV", str(tmp_path / "nope"))
    assert vs.venv_python() is None
    with pytest.raises(pytest.skip.Exception, match="no vLLM CPU venv"):
        vs.require_venv()
