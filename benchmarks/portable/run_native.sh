#!/usr/bin/env bash
# Run hardbyte/postgresql-job-queue-benchmarking natively (no Docker) with brooq's adapters.
# benchmarks/portable/README.md says what it does and why; every step is here.
#
#   run_native.sh checkout MIRROR_GIT_DIR [COMMIT]   extract the harness into $HARNESS_DIR
#   run_native.sh setup                              venvs + the local PostgreSQL (idempotent)
#   run_native.sh pg start|stop|wipe|status          the local PostgreSQL alone
#   run_native.sh run [bench run arguments]          `bench.py run`, natively; with --scale F
#                                                    every phase of --scenario lasts F times as long
#   run_native.sh smoke                              the reduced runs of the README (about 30 min)
#   run_native.sh combine|compare ...                the harness's other commands
#
# Environment: HARNESS_DIR (the harness checkout; required), NATIVE_ROOT (venvs, default
# /tmp/harness-native), HARNESS_PGDIR (the cluster, default /tmp/harness-pg), PG_BIN
# (default /usr/lib/postgresql/15/bin), PYTHON (default python3, 3.11+), MAX_LOAD (wait
# before a run while the 1-minute load average is above it, default 3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BROOQ_DIR="$(cd "$HERE/../.." && pwd)"
NATIVE_ROOT="${NATIVE_ROOT:-/tmp/harness-native}"
PYTHON="${PYTHON:-python3}"
MAX_LOAD="${MAX_LOAD:-3}"
PGQUEUER_VERSION="${PGQUEUER_VERSION:-1.6.0}"
HARNESS_COMMIT=93677cab92dad89ee9eccb0d6e113893de43cbe6
export NATIVE_ROOT

die() { echo "run_native.sh: $*" >&2; exit 2; }

need_harness() {
  [[ -n "${HARNESS_DIR:-}" ]] || die "set HARNESS_DIR to the harness checkout (see README.md)"
  [[ -f "$HARNESS_DIR/bench.py" ]] || die "HARNESS_DIR=$HARNESS_DIR holds no bench.py"
  HARNESS_DIR="$(cd "$HARNESS_DIR" && pwd)"
  export HARNESS_DIR
}

# The fetched mirror is a bare repository whose results/ blobs are not all stored, and
# whose pgque submodule is absent: extract everything but results/ (no adapter of ours
# needs pgque's).
checkout() {
  local mirror="${1:?usage: checkout MIRROR_GIT_DIR [COMMIT]}" commit="${2:-$HARNESS_COMMIT}"
  [[ -n "${HARNESS_DIR:-}" ]] || die "set HARNESS_DIR to where the harness should go"
  mkdir -p "$HARNESS_DIR"
  git -C "$mirror" archive "$commit" -- . ':(exclude)results' | tar -x -C "$HARNESS_DIR"
  echo "harness $(git -C "$mirror" rev-parse --short "$commit") extracted into $HARNESS_DIR"
}

# venv NAME PIP_ARGS...: a venv of its own under NATIVE_ROOT, made once.
venv() {
  local name="$1"; shift
  local dir="$NATIVE_ROOT/$name"
  if [[ ! -x "$dir/bin/python" ]]; then
    "$PYTHON" -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install -q "$@"
}

setup() {
  need_harness
  mkdir -p "$NATIVE_ROOT"
  # The harness's own dependencies (its pyproject.toml); it runs from its checkout.
  venv venv-harness 'psycopg[binary]>=3.2' 'matplotlib>=3.9' 'pandas>=2.2' 'numpy>=2.0' \
    'pydantic>=2'
  # brooq from this checkout, as the brief of issue 31 asks.
  venv venv-brooq -e "$BROOQ_DIR"
  venv venv-pgqueuer "pgqueuer==$PGQUEUER_VERSION" asyncpg
  # procrastinate at the versions the harness's adapter pins (its uv project).
  local pins
  pins=$(grep -oE '"(procrastinate|psycopg\[binary\])==[^"]+"' \
    "$HARNESS_DIR/procrastinate-bench/pyproject.toml" | tr -d '"')
  [[ -n "$pins" ]] || die "no pins found in procrastinate-bench/pyproject.toml"
  # shellcheck disable=SC2086
  venv venv-procrastinate $pins
  native pg start
}

native() {
  need_harness
  "$NATIVE_ROOT/venv-harness/bin/python" "$HERE/native.py" "$@"
}

wait_for_quiet() {
  local deadline=$((SECONDS + 1800)) load
  while :; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    if awk -v l="$load" -v m="$MAX_LOAD" 'BEGIN { exit !(l <= m) }'; then
      return
    fi
    ((SECONDS < deadline)) || die "load average $load stayed above $MAX_LOAD for 30 min"
    echo "run_native.sh: load average $load > $MAX_LOAD, waiting" >&2
    sleep 30
  done
}

run() {
  need_harness
  wait_for_quiet
  # Every adapter's documented bulk path, 128 rows at most per call (the contract's
  # default). Without it the harness's procrastinate adapter defers one job per call
  # with its own sleep-per-job pacing, which falls short of the offered rate here.
  export PRODUCER_BATCH_MAX="${PRODUCER_BATCH_MAX:-128}"
  native run "$@"
}

# The reduced runs quoted in README.md: each pressure scenario at 1/60 of its length
# (60 s under pressure) for the three systems, one system after the other, then
# brooq's crash recovery at full length (4.5 min) with two replicas, as the harness's
# sweep runs it (there at 300 jobs/s per replica).
smoke() {
  local common=(--worker-count 8 --sample-every 5)
  run --scenario idle_in_tx_saturation --scale 0.01667 --systems brooq,procrastinate,pgqueuer \
    --producer-rate 200 "${common[@]}"
  run --scenario active_readers --scale 0.01667 --systems brooq,procrastinate,pgqueuer \
    --producer-rate 200 "${common[@]}"
  run --scenario chaos_crash_recovery --systems brooq --replicas 2 --producer-rate 100 \
    "${common[@]}"
}

cmd="${1:-}"
[[ -n "$cmd" ]] || { sed -n '2,17p' "$0"; exit 2; }
shift
case "$cmd" in
  checkout) checkout "$@" ;;
  setup) setup ;;
  pg) native pg "$@" ;;
  run) run "$@" ;;
  smoke) smoke ;;
  combine | compare) native "$cmd" "$@" ;;
  *) die "unknown command $cmd (checkout, setup, pg, run, smoke, combine, compare)" ;;
esac
