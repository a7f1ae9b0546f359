"""The neutral harness's adapter contract as brooq's adapters implement it (benchmarks/portable).

The adapters run end to end only beside the harness (benchmarks/portable/README.md);
here are the parts whose mistakes would skew its numbers without failing a run:
the settings read from the environment, the 30 s pickup window and its
percentiles, the fixed-rate credit, the harness's tokens, the handler's reports
over a real unix datagram socket, the JSON lines, and the scaling of scenarios.
"""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.portable import contract, native
from benchmarks.portable.contract import (
    ContractError,
    Credit,
    Emitter,
    LatencyWindow,
    Report,
    Reporter,
    Settings,
)

URL = "postgres://bench:bench@localhost:15555/brooq_bench?sslmode=disable"


def test_settings_take_the_harness_defaults_and_name_the_database() -> None:
    s = Settings.from_env({"DATABASE_URL": URL})
    assert (s.producer_rate, s.worker_count, s.sample_every_s, s.batch_max) == (800, 32, 5, 128)
    assert s.harness_paced and s.observer
    assert s.db_name == "brooq_bench"


def test_settings_read_every_variable_of_the_contract() -> None:
    env = {
        "DATABASE_URL": URL,
        "PRODUCER_MODE": "depth-target",
        "PRODUCER_RATE": "200",
        "PRODUCER_PACING": "adapter",
        "PRODUCER_BATCH_MAX": "64",
        "PRODUCER_BATCH_MS": "10",
        "TARGET_DEPTH": "4000",
        "WORKER_COUNT": "8",
        "JOB_PAYLOAD_BYTES": "512",
        "JOB_WORK_MS": "0",
        "SAMPLE_EVERY_S": "2",
        "BENCH_INSTANCE_ID": "1",
    }
    s = Settings.from_env(env)
    assert (s.producer_mode, s.producer_rate, s.pacing, s.batch_max, s.batch_ms) == (
        "depth-target",
        200,
        "adapter",
        64,
        10,
    )
    assert (s.target_depth, s.worker_count, s.payload_bytes, s.work_ms) == (4000, 8, 512, 0)
    assert not s.harness_paced and not s.observer


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "DATABASE_URL is not set"),
        ({"DATABASE_URL": URL, "WORKER_COUNT": "eight"}, "WORKER_COUNT='eight': not a number"),
        ({"DATABASE_URL": URL, "WORKER_COUNT": "0"}, "WORKER_COUNT='0': must be at least 1"),
        ({"DATABASE_URL": URL, "PRODUCER_MODE": "burst"}, "PRODUCER_MODE='burst'"),
        ({"DATABASE_URL": URL, "PRODUCER_PACING": "x"}, "PRODUCER_PACING='x'"),
    ],
)
def test_a_bad_setting_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        Settings.from_env(env)


def test_the_rate_follows_the_harness_control_file(tmp_path: Path) -> None:
    control = tmp_path / "producer_rate.txt"
    s = Settings.from_env({"DATABASE_URL": URL, "PRODUCER_RATE_CONTROL_FILE": str(control)})
    assert s.current_rate() == 800  # no file yet: the base rate
    control.write_text("1200.0")  # a high-load phase
    assert s.current_rate() == 1200
    control.write_text("garbage")
    assert s.current_rate() == 800


def test_percentiles_are_within_a_thousandth_of_the_exact_ones() -> None:
    window = LatencyWindow()
    for ms in range(1, 1001):
        window.add(float(ms), now=100.0)
    p50, p95, p99 = window.percentiles((0.50, 0.95, 0.99), now=100.5)
    for got, exact in ((p50, 500.0), (p95, 950.0), (p99, 990.0)):
        assert exact <= got <= exact * 1.001


def test_the_window_forgets_what_is_older_than_30_seconds() -> None:
    window = LatencyWindow()
    window.add(5000.0, now=10.0)
    window.add(2.0, now=35.0)
    assert window.percentiles((0.99,), now=39.9)[0] == pytest.approx(5000.0, rel=1e-3)
    assert window.percentiles((0.99,), now=41.0)[0] == pytest.approx(2.0, rel=1e-3)
    assert window.percentiles((0.5,), now=70.0) == [0.0]


def test_the_window_stays_bounded_whatever_the_rate() -> None:
    window = LatencyWindow()
    for i in range(200_000):
        window.add(1.0 + (i % 7), now=i / 1000.0)
    assert len(window._slots) <= 32
    assert sum(len(counts) for counts in window._slots.values()) <= 32 * 7


def test_a_negative_latency_counts_as_zero() -> None:
    window = LatencyWindow()
    window.add(-3.0, now=1.0)
    assert window.percentiles((0.5,), now=1.0) == [0.0]


def test_credit_pays_for_the_real_time_elapsed_not_per_call() -> None:
    credit = Credit(now=0.0)
    assert credit.take(now=0.25, rate=20.0, cap=128) == 5
    # a stalled loop: 10 s passed in one call; 200 owed, 128 now, the rest next time
    assert credit.take(now=10.25, rate=20.0, cap=128) == 128
    assert credit.take(now=10.25, rate=20.0, cap=128) == 72
    assert credit.take(now=10.375, rate=4.0, cap=128) == 0
    assert credit.owed == 0.5


@pytest.mark.parametrize(
    ("line", "count"),
    [("ENQUEUE 5\n", 5), ("ENQUEUE 128", 128), ("ENQUEUE x", 0), ("STOP", 0), ("", 0)],
)
def test_tokens_of_the_harness_pacer(line: str, count: int) -> None:
    assert contract.parse_token(line) == count


def test_a_payload_carries_its_insert_time_and_its_size() -> None:
    body = contract.payload(7, 1234.5, 256)
    assert (body["seq"], body["t"]) == (7, 1234.5)
    assert len(json.dumps(body)) == 256
    assert len(json.dumps(contract.payload(123456789, 1.7e9 + 0.123456, 256))) == 256
    assert contract.payload(1, 1.0, 0)["pad"] == ""


def test_a_report_crosses_a_real_datagram_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "reports.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    receiver.settimeout(5)
    try:
        Reporter(path).send(Report(inserted=100.0, started=100.0125))
        got = Report.decode(receiver.recv(256))
    finally:
        receiver.close()
    assert got is not None
    assert got.pickup_ms == pytest.approx(12.5)
    assert Report.decode(b"not a report") is None


def test_a_report_to_a_vanished_adapter_is_dropped(tmp_path: Path) -> None:
    Reporter(str(tmp_path / "gone.sock")).send(Report(1.0, 2.0))  # no exception
    Reporter("").send(Report(1.0, 2.0))


def test_samples_are_one_json_line_each_stamped_with_the_replica() -> None:
    out = io.StringIO()
    emitter = Emitter("brooq", 1, out)
    emitter.descriptor(event_tables=["public.job"], extensions=[])
    emitter.sample("claim_p99_ms", 4.2, 30.0)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["kind"] == "descriptor" and lines[0]["event_tables"] == ["public.job"]
    sample = lines[1]
    assert sample["kind"] == sample["subject_kind"] == "adapter"
    assert (sample["metric"], sample["value"], sample["window_s"]) == ("claim_p99_ms", 4.2, 30.0)
    assert lines[0]["instance_id"] == sample["instance_id"] == 1
    assert sample["t"].endswith("Z")


def test_ticks_fall_on_wall_clock_multiples() -> None:
    assert contract.next_tick(1003.2, 5) == 1005
    assert contract.next_tick(1005.0, 5) == 1010


def test_scale_is_taken_out_of_the_harness_arguments() -> None:
    argv = ["run", "--scale", "0.5", "--systems", "brooq"]
    assert native.take_scale(argv) == (["run", "--systems", "brooq"], 0.5)
    assert native.take_scale(["run", "--scale=0.1"]) == (["run"], 0.1)
    assert native.take_scale(["run"]) == (["run"], None)
    with pytest.raises(SystemExit, match="must be above 0"):
        native.take_scale(["run", "--scale", "0"])


def test_scaled_scenarios_keep_their_shape_and_a_full_pickup_window_of_warmup() -> None:
    def parse_duration(text: str) -> int:
        return int(text[:-1]) * {"s": 1, "m": 60}[text[-1]]

    phases = SimpleNamespace(
        SCENARIOS={
            "idle_in_tx_saturation": [
                "warmup=warmup:10m",
                "clean_1=clean:60m",
                "idle_1=idle-in-tx:60m",
            ],
            "chaos": ["warmup=warmup:30s", "r=repeated-kill(instance=0,period=20s):120s"],
        },
        parse_duration=parse_duration,
    )
    native.scale_scenarios(phases, 1 / 60)
    assert phases.SCENARIOS["idle_in_tx_saturation"] == [
        "warmup=warmup:30s",
        "clean_1=clean:60s",
        "idle_1=idle-in-tx:60s",
    ]
    assert phases.SCENARIOS["chaos"] == [
        "warmup=warmup:30s",
        "r=repeated-kill(instance=0,period=20s):10s",
    ]
