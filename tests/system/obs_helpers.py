"""Helpers of the observability tests: scraping /metrics, HTTP calls, Prometheus tools,
and a private PostgreSQL cluster that a test may stop and start.

Every network call has a timeout; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.system.harness import Supervisor, free_port

ROOT = Path(__file__).resolve().parents[2]
PG_SH = ROOT / "scripts" / "pg.sh"
_installed: dict[str, bool] = {}


# --- HTTP ------------------------------------------------------------------------------------


def http_addr(sup: Supervisor, timeout: float = 20.0) -> str:
    """``host:port`` of a supervisor's surface, from its SupervisorStarted log event."""
    addr = sup.wait_event("SupervisorStarted", timeout)["http"]
    assert isinstance(addr, str) and addr != "off", addr
    return addr


def request(
    url: str, method: str = "GET", token: str | None = None, timeout: float = 5.0
) -> tuple[int, str]:
    """(status, body) of one HTTP request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def request_json(url: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
    """(status, decoded JSON body)."""
    status, body = request(url, method, token)
    return status, json.loads(body)


def healthz(addr: str) -> tuple[int, str]:
    """(status, reason) of /healthz; (0, error) when the surface does not answer at all."""
    try:
        status, body = request(f"http://{addr}/healthz", timeout=3.0)
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc)
    return status, json.loads(body).get("reason", "")


# --- /metrics --------------------------------------------------------------------------------


class Scrape:
    """One /metrics page, parsed: ``value(name, **labels)`` sums the matching samples."""

    def __init__(self, text: str, seconds: float) -> None:
        self.text, self.seconds = text, seconds
        self.samples = [
            s for family in text_string_to_metric_families(text) for s in family.samples
        ]

    def matching(self, name: str, **labels: str) -> list[Any]:
        """Samples named ``name`` whose labels include ``labels``."""
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the matching samples (0 when there are none)."""
        return float(sum(s.value for s in self.matching(name, **labels)))

    def names(self) -> set[str]:
        """Every sample name on the page."""
        return {s.name for s in self.samples}


def scrape(addr: str) -> Scrape:
    """GET /metrics and parse it, timing the request."""
    started = time.monotonic()
    status, body = request(f"http://{addr}/metrics", timeout=10.0)
    assert status == 200, (status, body[:200])
    return Scrape(body, time.monotonic() - started)


def exported_metric_names() -> set[str]:
    """Every sample name brooq can export, read from brooq/metrics.py and brooq/gauges.py
    (the families read at a scrape).

    Histograms add ``_bucket``, ``_sum`` and ``_count``; counters are declared
    with their ``_total`` name.
    """
    source = "".join((ROOT / "brooq" / name).read_text() for name in ("metrics.py", "gauges.py"))
    names: set[str] = set()
    for kind, name in re.findall(
        r'(Counter|Gauge|Histogram|MetricFamily|counter)\(\s*"(brooq_\w+)"', source
    ):
        names.add(name)
        if kind == "Histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


# --- Prometheus tools (the Debian package `prometheus`) ---------------------------------


def ensure_prometheus_tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``, installing the Debian package when missing.

    Installing needs root (as in CI); otherwise the caller fails, never skips.
    """
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None
    )
    if found:
        return found
    if os.geteuid() != 0:
        raise AssertionError(
            f"{name} is missing: install the Debian package `prometheus` "
            "(apt-get install prometheus)"
        )
    if not _installed.get("prometheus"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(
            ["apt-get", "update", "-qq"], check=True, env=env, timeout=600, capture_output=True
        )
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"],
            check=True,
            env=env,
            timeout=900,
            capture_output=True,
        )
        _installed["prometheus"] = True
    found = shutil.which(name) or f"/usr/bin/{name}"
    assert os.access(found, os.X_OK), f"{name} still missing after installing `prometheus`"
    return found


# --- a private PostgreSQL cluster ----------------------------------------------------------


class PrivateCluster:
    """A throwaway cluster of scripts/pg.sh on its own port and folder, for outage tests."""

    def __init__(self) -> None:
        # Under /tmp with mode 0755: as root, pg.sh runs PostgreSQL as `postgres`,
        # which must traverse every parent folder (pytest's tmp_path is 0700).
        self.parent = Path(tempfile.mkdtemp(prefix="brooq-pg-", dir="/tmp"))
        os.chmod(self.parent, 0o755)
        self.port = free_port()
        self.env = {
            **os.environ,
            "BROOQ_PGDIR": str(self.parent / "cluster"),
            "BROOQ_PGPORT": str(self.port),
        }

    def run(self, action: str, timeout: float = 120.0) -> str:
        """``pg.sh ACTION`` for this cluster; its stdout."""
        done = subprocess.run(
            [str(PG_SH), action], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"pg.sh {action}: {done.stderr}"
        return done.stdout.strip()

    def url(self) -> str:
        """The URL of the cluster's brooq database."""
        return self.run("url")

    def accepts(self) -> bool:
        """True while something listens on the cluster's port."""
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def destroy(self) -> None:
        """Stop the cluster and delete its files."""
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.run("down")
        shutil.rmtree(self.parent, ignore_errors=True)


@contextlib.contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started private cluster, always destroyed afterwards."""
    cluster = PrivateCluster()
    try:
        cluster.run("up")
        yield cluster
    finally:
        cluster.destroy()
