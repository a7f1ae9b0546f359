"""The app ``brooq supervise`` runs for the harness: one kind, ``bench.job``.

Its handler takes the wall time first thing, does ``JOB_WORK_MS`` of synthetic
work (a sleep, as the harness's other adapters do), then reports the job's
insert time and its start to the adapter over the unix datagram socket named
by ``BROOQ_BENCH_SOCKET`` (contract.Reporter): the adapter turns the reports
into pickup percentiles and the completion rate.
"""

from __future__ import annotations

import os
import time

from contract import Report, Reporter

import brooq

TOPIC = "bench.job"
WORK_S = float(os.environ.get("JOB_WORK_MS", "1")) / 1000.0

queue = brooq.Queue()
reporter = Reporter(os.environ.get("BROOQ_BENCH_SOCKET", ""))


@queue.kind(TOPIC)
def bench_job(claim: brooq.Claim) -> None:
    """Synthetic work, then one report (insert time, start time) to the adapter."""
    started = time.time()
    if WORK_S > 0:
        time.sleep(WORK_S)
    reporter.send(Report(float(claim.payload["t"]), started))
