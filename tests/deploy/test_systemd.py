"""The systemd units in systemd/: ``systemd-analyze verify`` is clean, the settings are the ones
documented, the command lines parse, and the hardening keeps its exposure score low.

``systemd-analyze verify`` insists that ExecStart's binary exists, so it runs on copies
of the units whose ``/opt/brooq/venv/bin/`` is this venv's scripts folder (where
``brooq`` is). It does not look up User= or WorkingDirectory=. systemd-analyze comes
from Debian's ``systemd`` package: when missing, it is installed (as root); never skipped.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from datetime import timedelta
from pathlib import Path

import pytest

from brooq import cli
from brooq.config import CREDENTIAL_FILES
from brooq.vocabulary import parse_duration

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
SERVICE = UNITS / "brooq.service"
MIGRATE = UNITS / "brooq-migrate.service"
PLACEHOLDER_BIN = "/opt/brooq/venv/bin/"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallFilter": "@system-service",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "CapabilityBoundingSet": "",
}


def systemd_analyze() -> str:
    """The systemd-analyze binary, installed from Debian's systemd package when missing."""
    found = shutil.which("systemd-analyze")
    if found:
        return found
    assert os.geteuid() == 0, "systemd-analyze is missing: apt-get install systemd (as root)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        ["apt-get", "update", "-qq"], check=True, env=env, timeout=300, capture_output=True
    )
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "systemd"],
        check=True,
        env=env,
        timeout=600,
        capture_output=True,
    )
    found = shutil.which("systemd-analyze")
    assert found, "apt-get install systemd did not provide systemd-analyze"
    return found


def settings(unit: Path) -> dict[str, list[str]]:
    """KEY -> every value it is given in the unit (all sections; comments skipped)."""
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def one(unit: Path, key: str) -> str:
    values = settings(unit).get(key, [])
    assert len(values) == 1, f"{unit.name}: {key}= given {len(values)} times"
    return values[0]


def local_copy(unit: Path, folder: Path) -> Path:
    """``unit`` with its binaries pointing into this venv, written to ``folder``."""
    scripts = Path(sysconfig.get_path("scripts"))
    assert (scripts / "brooq").is_file(), f"no brooq script in {scripts}"
    copy = folder / unit.name
    copy.write_text(unit.read_text().replace(PLACEHOLDER_BIN, f"{scripts}/"))
    return copy


def verify(*units: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze(), "verify", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=units[0].parent,
    )


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    copies = [local_copy(SERVICE, tmp_path), local_copy(MIGRATE, tmp_path)]
    done = verify(*copies)
    # verify exits 0 even after "ignoring" a bad line: clean means nothing printed at all.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_verify_would_notice_a_mistake(tmp_path: Path) -> None:
    """The check above is not vacuous: a bad value and a missing binary are reported."""
    copy = local_copy(SERVICE, tmp_path)
    copy.write_text(copy.read_text().replace("WatchdogSec=30s", "WatchdogSec=thirty"))
    done = verify(copy)
    assert "thirty" in done.stdout + done.stderr
    (tmp_path / "brooq.service").write_text(SERVICE.read_text())  # /opt/brooq/... is absent
    done = verify(tmp_path / "brooq.service")
    assert done.returncode != 0 and "is not executable" in done.stderr


def test_the_worker_unit_is_a_watched_notify_service() -> None:
    assert one(SERVICE, "Type") == "notify"
    assert one(SERVICE, "NotifyAccess") == "main"
    assert parse_duration(one(SERVICE, "WatchdogSec")) >= timedelta(seconds=10)
    assert one(SERVICE, "KillMode") == "mixed"
    assert one(SERVICE, "KillSignal") == "SIGTERM"
    assert one(SERVICE, "Restart") == "on-failure"
    assert one(SERVICE, "EnvironmentFile") == "-/etc/brooq/brooq.env"
    assert (one(SERVICE, "User"), one(SERVICE, "Group")) == ("brooq", "brooq")


def test_the_stop_timeout_leaves_room_for_the_graceful_timeout() -> None:
    argv = shlex.split(one(SERVICE, "ExecStart"))
    graceful = parse_duration(argv[argv.index("--graceful-timeout") + 1])
    stop = parse_duration(one(SERVICE, "TimeoutStopSec"))
    assert stop >= graceful + timedelta(seconds=10), (stop, graceful)


def test_the_command_lines_are_brooq_commands_that_parse() -> None:
    worker = shlex.split(one(SERVICE, "ExecStart"))
    migrate = shlex.split(one(MIGRATE, "ExecStart"))
    assert worker[0] == migrate[0] == PLACEHOLDER_BIN + "brooq"
    args = cli.parser().parse_args(worker[1:])
    assert (args.command, args.app) == ("supervise", "myapp.jobs:queue")
    assert cli.parser().parse_args(migrate[1:]).func is cli.migrate.cmd_migrate
    assert migrate[1:] == ["migrate", "up"]
    assert "migrate" not in worker, "the worker never migrates"


def test_the_migration_is_a_oneshot_deploy_step() -> None:
    assert one(MIGRATE, "Type") == "oneshot"
    assert "WantedBy" not in settings(MIGRATE), "a deploy step, not something started at boot"
    pulled = [v for values in settings(SERVICE).values() for v in values if "migrate" in v]
    assert pulled == [], "brooq.service must not pull the migration in"


@pytest.mark.parametrize("unit", [SERVICE, MIGRATE], ids=lambda p: p.name)
def test_secrets_come_through_credentials_brooq_reads(unit: Path) -> None:
    credentials = dict(v.split(":", 1) for v in settings(unit)["LoadCredential"])
    assert set(credentials) <= set(CREDENTIAL_FILES)
    assert "database-url" in credentials
    assert all(path.startswith("/etc/brooq/credentials/") for path in credentials.values())
    assert not any(
        re.search(r"DATABASE_URL|BROOQ_TOKEN|password", v, re.IGNORECASE)
        for v in settings(unit).get("Environment", [])
    )


def test_the_worker_unit_loads_both_credentials() -> None:
    names = {v.split(":", 1)[0] for v in settings(SERVICE)["LoadCredential"]}
    assert names == set(CREDENTIAL_FILES)


@pytest.mark.parametrize("unit", [SERVICE, MIGRATE], ids=lambda p: p.name)
def test_hardening(unit: Path) -> None:
    for key, value in HARDENING.items():
        assert one(unit, key) == value, key


def test_exposure_score_stays_low(tmp_path: Path) -> None:
    copy = local_copy(SERVICE, tmp_path)
    done = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    match = re.search(r"Overall exposure level for brooq\.service: ([0-9.]+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match[1]) <= 2.0, done.stdout
