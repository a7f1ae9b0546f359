# brooq — developer commands. `make demo` and `make test` work from a fresh clone:
# they create the venv, install brooq, and start a throwaway PostgreSQL 15.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BROOQ := $(VENV)/bin/brooq
# The unprivileged brooq role of scripts/pg.sh's cluster; follows BROOQ_PGPORT (default 55433).
LOCAL_DATABASE_URL = $(shell scripts/pg.sh url)
PYTEST_ARGS ?=

.PHONY: dev db-up db-down migrate-up migrate-down migrate-status test lint demo bench chaos fleet clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The demo needs brooq alone (no test or lint tools); a dev venv has it already.
$(VENV)/.runtime: pyproject.toml
	@if [ ! -x $(PY) ]; then $(PYTHON) -m venv $(VENV); fi
	@if [ ! -f $(VENV)/.installed ]; then $(PY) -m pip install -q -e .; fi
	touch $@

## dev: create the venv and install brooq (editable) with the dev tools
dev: $(VENV)/.installed

## db-up / db-down: start / stop and delete the local PostgreSQL on 127.0.0.1:$BROOQ_PGPORT (55433).
##   `scripts/pg.sh url`: the app role brooq (CREATEDB, not a superuser);
##   `scripts/pg.sh admin-url`: the superuser brooq_admin (random password), for tests that need one
db-up:
	@scripts/pg.sh up
db-down:
	@scripts/pg.sh down

# migrate-*: against $DATABASE_URL, or the local database (started if needed) when unset.
migrate-up migrate-down migrate-status: dev
	@if [ -z "$$DATABASE_URL" ]; then scripts/pg.sh up; fi
	DATABASE_URL="$${DATABASE_URL:-$(LOCAL_DATABASE_URL)}" $(BROOQ) migrate $(subst migrate-,,$@)

## test: the whole suite (unit, integration, system) on a real PostgreSQL
test: dev
	@if [ -z "$$TEST_DATABASE_URL" ]; then scripts/pg.sh up; fi
	$(PY) -m pytest $(PYTEST_ARGS)

## chaos: the fault tests at full size (20,000 jobs per fault), table into docs/reliability.md
## (`make test` runs them at CI size, 2,000 jobs per fault)
chaos: dev
	@if [ -z "$$TEST_DATABASE_URL" ]; then scripts/pg.sh up; fi
	CHAOS_SIZE=$${CHAOS_SIZE:-full} $(PY) -m tests.chaos.report --update-doc

## fleet: the fleet test at full size (10 supervisors x 2 workers through PgBouncer, 20,000 jobs,
## 3 killed), figures into fleet-report.json for docs/reliability.md (`make test`: 4,000 jobs)
fleet: dev
	@if [ -z "$$TEST_DATABASE_URL" ]; then scripts/pg.sh up; fi
	FLEET_SIZE=full FLEET_REPORT=$${FLEET_REPORT:-fleet-report.json} $(PY) -m pytest -s tests/system/test_fleet.py

## lint: ruff check, ruff format --check and mypy --strict on brooq and tests
lint: dev
	$(VENV)/bin/ruff check brooq tests benchmarks
	$(VENV)/bin/ruff format --check brooq tests benchmarks
	$(VENV)/bin/mypy --strict brooq tests

## demo: local database, migrations, a few hundred demo jobs through real workers, a table of
##   outcomes, then commands to paste (brooq status, jobs list, dashboard)
demo: $(VENV)/.runtime
	@scripts/pg.sh up
	@DATABASE_URL='$(LOCAL_DATABASE_URL)' $(BROOQ) migrate up >/dev/null
	DATABASE_URL='$(LOCAL_DATABASE_URL)' $(PY) -m brooq.demo

## bench: the benchmark suite, 3 interleaved rounds, ~30 min (benchmarks/README.md); its report
##   ends with issue 21's targets, each met or not.
##   QUICK=1: tiny sizes, 1 round, proves it runs.
##   PEERS=pgqueuer,celery: the peer queues too (pgqueuer; Celery prefork on a private Redis),
##   each pip-installed into its own venv under benchmarks/.peers/ (never brooq's); Celery's
##   Redis is Debian's redis-server, apt-get installed when missing (as root).
##   BENCH_ARGS: more flags (--cpu-ms 2 --only drain,cpubound --rounds 5 --profile DIR)
bench: dev
	@if [ -z "$$BENCH_DATABASE_URL" ]; then scripts/pg.sh up; fi
	$(PY) -m benchmarks $(if $(QUICK),--quick) $(if $(PEERS),--peers $(PEERS)) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist *.egg-info
