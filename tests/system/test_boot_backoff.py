"""A child that dies at boot is restarted with a growing delay, not in a fork storm,
and the supervisor itself stays up and says it is unhealthy."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from tests.system.harness import Supervisor, wait_until


@pytest.mark.timeout(60)
def test_children_dying_at_boot_back_off(supervise: Callable[..., Supervisor]) -> None:
    sup = supervise("--workers", "2", app="sysapp_bootfail:queue")
    wait_until(lambda: len(sup.events("WorkerBootFailed")) >= 2, 15, "first boot failures")
    time.sleep(6)
    failures = sup.events("WorkerBootFailed")
    # Delays of 0.5, 1, 2, 4 s per slot: a handful of forks in ~7 s, not hundreds.
    assert 2 <= len(failures) <= 12, len(failures)
    delays = [float(f["retry_in_s"]) for f in failures if f.get("slot") == 0]
    assert delays == sorted(delays) and delays[-1] > delays[0], delays
    assert all(f["exit"] == "exited with code 3" for f in failures)
    assert not sup.exited(), "the supervisor must survive children that cannot boot"
    started = sup.events("SupervisorStarted")[0]
    url = f"http://{started['http']}/healthz"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url, timeout=5)
    assert caught.value.code == 503
    assert "workers running" in json.loads(caught.value.read())["reason"]
