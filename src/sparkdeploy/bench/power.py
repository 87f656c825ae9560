"""Joules per generated token for `bench probe`: the GPU's power from `nvidia-smi`, sampled while each run
streams, times the request's time, over its generated tokens.

Only where it means something: nvidia-smi must answer with a power figure (GB10 does; the sim has no GPU), and
the service must be on this machine (nvidia-smi reads this machine's GPU, not a remote service's). The reading
is this GPU's alone: for a service whose ranks span nodes it is the head's share. The query is the watchdog's
(`gpu_sample`, one definition for both; the watchdog file stays standard-library only).
"""

from __future__ import annotations

import ipaddress
import socket
import statistics
import threading
from urllib.parse import urlsplit

from sparkdeploy.node.scripts.watchdog import gpu_sample

SAMPLE_S = 0.25


def why_unreadable(url: str) -> str | None:
    """Why this machine cannot measure the energy of the service at `url`; None when it can."""
    host = urlsplit(url).hostname or ""
    if not _on_this_machine(host):
        return (f"the service at {host} is not on this machine (nvidia-smi reads this machine's GPU): run bench on "
                "the head to measure energy")
    sample = gpu_sample()
    if sample is None:
        return "nvidia-smi does not answer here (no NVIDIA GPU or driver)"
    if sample.get("power_w") is None:
        return "nvidia-smi reports no power.draw for this GPU"
    return None


def _on_this_machine(host: str) -> bool:
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    try:
        own = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        own = set()
    return all(ipaddress.ip_address(a).is_loopback or a in own for a in addrs)


class Meter:
    """The mean power of the GPU between entering and leaving: a sample on entry, one every SAMPLE_S in a
    thread, one on exit (a short run still has two)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)

    def _read(self) -> None:
        power = (gpu_sample() or {}).get("power_w")
        if power is not None:
            self.samples.append(power)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._read()

    def __enter__(self) -> "Meter":
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    @property
    def watts(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def joules_per_token(watts: float | None, seconds: float | None, tokens: int) -> float | None:
    """Energy of one request over what it generated (None without a power reading, a time or tokens)."""
    if watts is None or not seconds or tokens <= 0:
        return None
    return watts * seconds / tokens
