#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for development and tests.
#   scripts/pg.sh up      initdb (once) and start on 127.0.0.1:$PGPORT; prints nothing else on success
#   scripts/pg.sh down    stop it and delete its data
#   scripts/pg.sh stop    stop it, keep its data
#   scripts/pg.sh restart pg_ctl restart -m fast (used by fault tests)
#   scripts/pg.sh url     print the URL of the brooq database
# PostgreSQL refuses to run as root, so as root the cluster is owned by and run
# as the `postgres` user.
set -euo pipefail

PGPORT="${BROOQ_PGPORT:-55433}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${BROOQ_PGDIR:-$ROOT/.pgdata}"
if [ -z "${BROOQ_PGDIR:-}" ] && [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$ROOT" 2>/dev/null; then
    # The checkout is not reachable by the postgres user (e.g. under a 0700 home):
    # keep the cluster in /tmp, under a name derived from the checkout's path.
    DIR="/tmp/brooq-pgdata-$(printf '%s' "$ROOT" | md5sum | cut -c1-12)"
fi
DATA="$DIR/data"
LOG="$DIR/postgres.log"
USER_NAME=brooq
PASSWORD=brooq
DB=brooq

find_bindir() {
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"
        return
    fi
    for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
        if [ -x "$d/pg_ctl" ]; then echo "$d"; return; fi
    done
    return 1
}

BINDIR="$(find_bindir || true)"
if [ -z "$BINDIR" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "pg.sh: PostgreSQL binaries not found; installing the Debian package" >&2
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        BINDIR="$(find_bindir)"
    else
        echo "pg.sh: initdb/pg_ctl not found; install PostgreSQL 15 (apt-get install postgresql)" >&2
        exit 1
    fi
fi

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        (cd / && runuser -u postgres -- "$@")  # cwd may be unreadable for postgres
    else
        "$@"
    fi
}

url() { echo "postgresql://$USER_NAME:$PASSWORD@127.0.0.1:$PGPORT/$DB"; }

running() { as_owner "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

init() {
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$DIR"
        if ! runuser -u postgres -- test -w "$DIR"; then
            echo "pg.sh: user postgres cannot write $DIR (a parent folder is not traversable); set BROOQ_PGDIR" >&2
            exit 1
        fi
    fi
    local pwfile="$DIR/pwfile"
    echo "$PASSWORD" > "$pwfile"
    [ "$(id -u)" = 0 ] && chown postgres: "$pwfile"
    as_owner "$BINDIR/initdb" -D "$DATA" -U "$USER_NAME" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; exit 1; }
    rm -f "$pwfile"
    cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$DIR'
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
log_min_messages = warning
log_min_error_statement = panic
CONF
}

up() {
    [ -f "$DATA/PG_VERSION" ] || init
    if ! running; then
        as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null \
            || { tail -n 30 "$LOG" >&2; exit 1; }
    fi
    if ! as_owner "$BINDIR/psql" -h "$DIR" -p "$PGPORT" -U "$USER_NAME" -d postgres -Atqc \
            "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
        as_owner "$BINDIR/psql" -h "$DIR" -p "$PGPORT" -U "$USER_NAME" -d postgres -qc "CREATE DATABASE $DB" >/dev/null
    fi
}

case "${1:-}" in
    up) up ;;
    stop) running && as_owner "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null || true ;;
    down)
        if [ -f "$DATA/PG_VERSION" ] && running; then
            as_owner "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
        fi
        rm -rf "$DIR" ;;
    restart) as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -m fast -w -t 60 restart >/dev/null ;;
    url) url ;;
    *) echo "usage: scripts/pg.sh up|down|stop|restart|url" >&2; exit 2 ;;
esac
