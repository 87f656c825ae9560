"""Interrupting the real CLI mid-switch: the signal a user's Ctrl-C (SIGINT) or a service manager (SIGTERM)
sends, at the moment the command says it is switching releases."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def signal_mid_switch(args: list[str], sig: int, timeout: float = 1500) -> tuple[int, dict]:
    """Run `python -m sparkdeploy ARGS --json` (no injected fault), send `sig` once it logs "switching to
    release", and return its exit code and JSON result; its stderr must hold no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "SPARKDEPLOY_FAULT"}
    p = subprocess.Popen([sys.executable, "-m", "sparkdeploy", *args, "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    for line in p.stderr:  # the CLI logs each phase on stderr
        if "switching to release" in line:
            break
    p.send_signal(sig)
    out, err = p.communicate(timeout=timeout)
    assert "Traceback" not in err, err[-3000:]
    return p.returncode, json.loads(out)
