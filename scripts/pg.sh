#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for development and tests.
#   scripts/pg.sh up        initdb (once), start on 127.0.0.1:$PGPORT, make roles and access safe;
#                           prints nothing else on success. Upgrades a cluster made by an older
#                           pg.sh (brooq a superuser, local trust) in place.
#   scripts/pg.sh down      stop it and delete its data
#   scripts/pg.sh stop      stop it, keep its data
#   scripts/pg.sh restart   pg_ctl restart -m fast (used by fault tests)
#   scripts/pg.sh url       print the URL of the brooq database (role brooq)
#   scripts/pg.sh admin-url print the URL of the superuser brooq_admin (random password)
#
# Roles:
#   - the cluster owner (the OS user running PostgreSQL: `postgres` as root, else you) is the
#     bootstrap superuser. It has no password: it logs in only over the unix socket, by peer,
#     and the socket's folder is 0700, so no other OS user can reach the socket at all.
#   - brooq (password brooq, TCP only) is what the app, `make demo`, tests and benchmarks use:
#     LOGIN CREATEDB, not a superuser, so it cannot run programs or read files as the cluster
#     owner. It owns the databases it creates (tests clone them with CREATE DATABASE … TEMPLATE).
#   - brooq_admin is a superuser for the few tests that need one; its password is random, in a
#     0600 file in the cluster folder, because 127.0.0.1 is reachable by every local user.
# PostgreSQL refuses to run as root, so as root the cluster is owned by and run as `postgres`.
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
APP_ROLE=brooq
APP_PASSWORD=brooq
ADMIN_ROLE=brooq_admin
ADMIN_PWFILE="$DIR/admin.password"
DB=brooq
if [ "$(id -u)" = 0 ]; then OWNER=postgres; else OWNER="$(id -un)"; fi

url() { echo "postgresql://$APP_ROLE:$APP_PASSWORD@127.0.0.1:$PGPORT/$DB"; }

admin_url() {
    if [ ! -s "$ADMIN_PWFILE" ]; then
        echo "pg.sh: no $ADMIN_PWFILE; run scripts/pg.sh up first" >&2
        exit 1
    fi
    echo "postgresql://$ADMIN_ROLE:$(cat "$ADMIN_PWFILE")@127.0.0.1:$PGPORT/postgres"
}

# url and admin-url need no binaries (the Makefile calls url at every make).
case "${1:-}" in
    url) url; exit 0 ;;
    admin-url) admin_url; exit 0 ;;
esac

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

running() { as_owner "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

# psql over the unix socket as ROLE (the owner by peer; during an upgrade, the old roles by
# the old trust line), SQL on stdin or in the arguments; stops at the first error, and never
# prompts for a password (-w): a role that would need one fails instead.
psql_as() {
    local role="$1" db="$2"
    shift 2
    as_owner "$BINDIR/psql" -X -q -At -w -v ON_ERROR_STOP=1 -h "$DIR" -p "$PGPORT" -U "$role" -d "$db" "$@"
}

start() {
    as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null \
        || { tail -n 30 "$LOG" >&2; exit 1; }
}

restart() {
    as_owner "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -m fast -w -t 60 restart >/dev/null \
        || { tail -n 30 "$LOG" >&2; exit 1; }
}

# The folder holds the socket: 0700 keeps every other OS user away from it.
secure_dir() {
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$DIR"
        if ! runuser -u postgres -- test -w "$DIR"; then
            echo "pg.sh: user postgres cannot write $DIR (a parent folder is not traversable); set BROOQ_PGDIR" >&2
            exit 1
        fi
    fi
}

init() {
    secure_dir
    # The bootstrap superuser is the OS user running the cluster, without a password
    # (peer over the socket only); brooq is created afterwards as an ordinary role.
    as_owner "$BINDIR/initdb" -D "$DATA" -U "$OWNER" --auth-local=peer --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; exit 1; }
    cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$DIR'
unix_socket_permissions = 0700
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
log_min_messages = warning
log_min_error_statement = panic
CONF
    write_hba || true  # before the first start, so a new cluster needs no restart
}

# Clusters from an older pg.sh lack the socket permissions line; the last line wins, so append.
secure_conf() {
    if ! grep -qx "unix_socket_permissions = 0700" "$DATA/postgresql.conf"; then
        printf '%s\n' "# scripts/pg.sh: only the cluster owner may open the socket" \
            "unix_socket_permissions = 0700" >>"$DATA/postgresql.conf"
    fi
}

# pg_hba.conf is ours: rewritten whole. Returns 0 when it changed (the server must reread it).
write_hba() {
    local want
    want="$(
        echo "# Written by scripts/pg.sh at every \`up\`; edits here are overwritten."
        echo "# The cluster owner ($OWNER) by peer over the socket (its folder is 0700, so only that"
        echo "# OS user reaches it); everyone else, and every TCP connection, with a SCRAM password."
        printf '%-7s %-12s %-15s %-15s %s\n' \
            local all "$OWNER" "" peer \
            local replication "$OWNER" "" peer \
            local all all "" scram-sha-256 \
            host all all 127.0.0.1/32 scram-sha-256 \
            host all all ::1/128 scram-sha-256
    )"
    if [ "$(cat "$DATA/pg_hba.conf")" = "$want" ]; then
        return 1
    fi
    # Write through the existing file so it keeps its owner and mode (postgres, 0600).
    printf '%s\n' "$want" >"$DATA/pg_hba.conf"
}

# A cluster from the old pg.sh: its bootstrap superuser (OID 10, owner of the system catalogs)
# is `brooq`, local auth is trust. Demoting OID 10 is not enough (as owner of pg_authid it could
# make itself superuser again), so rename it to the cluster owner, drop its known password,
# and let ensure_roles create a fresh, unprivileged brooq. A superuser cannot rename itself,
# hence the detour through brooq_admin.
upgrade_old_cluster() {
    if [ "$OWNER" = "$APP_ROLE" ] || [ "$OWNER" = "$ADMIN_ROLE" ]; then
        echo "pg.sh: the OS user is named $OWNER, like one of the cluster's roles; run as another user" >&2
        exit 1
    fi
    local bootstrap
    if ! bootstrap="$(psql_as "$APP_ROLE" postgres -c "SELECT rolname FROM pg_roles WHERE oid = 10" 2>/dev/null)"; then
        echo "pg.sh: cannot log in to $DIR as $OWNER (peer) nor as $APP_ROLE (the old trust); recreate it (scripts/pg.sh down)" >&2
        exit 1
    fi
    if [ "$bootstrap" != "$APP_ROLE" ]; then
        echo "pg.sh: cannot log in as $OWNER and the bootstrap superuser is $bootstrap, not $APP_ROLE; recreate the cluster (scripts/pg.sh down)" >&2
        exit 1
    fi
    echo "pg.sh: upgrading $DIR: $APP_ROLE stops being the superuser" >&2
    psql_as "$APP_ROLE" postgres <<SQL
SELECT 'CREATE ROLE $ADMIN_ROLE' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$ADMIN_ROLE')
\gexec
ALTER ROLE $ADMIN_ROLE SUPERUSER LOGIN;
SQL
    psql_as "$ADMIN_ROLE" postgres <<SQL
ALTER ROLE $APP_ROLE RENAME TO "$OWNER";
ALTER ROLE "$OWNER" PASSWORD NULL;
SQL
}

# Hand what the bootstrap superuser owns in DB (tables, views, sequences, routines, types,
# schemas: what migrations and tests create) to brooq. The old brooq created these as OID 10.
give_objects_to_app() {
    psql_as "$OWNER" "$1" <<'SQL'
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.oid::regclass AS name,
               CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                              WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'S' THEN 'SEQUENCE'
                              ELSE 'TABLE' END AS kind
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relowner = 10 AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
          AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_'
          -- owned sequences (serial, identity) follow their table
          AND NOT (c.relkind = 'S' AND EXISTS (
              SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass
                AND d.deptype IN ('a', 'i')))
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO brooq', r.kind, r.name);
    END LOOP;
    FOR r IN
        SELECT p.oid::regprocedure AS name FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE p.proowner = 10 AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname !~ '^pg_'
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                            AND d.objid = p.oid AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO brooq', r.name);
    END LOOP;
    FOR r IN
        SELECT t.oid::regtype AS name FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE t.typowner = 10 AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname !~ '^pg_'
          -- enums, domains, ranges, standalone composites; arrays, multiranges and row
          -- types follow their base type or table
          AND (t.typtype IN ('e', 'd', 'r') OR (t.typtype = 'c' AND EXISTS (
              SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind = 'c')))
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                            AND d.objid = t.oid AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO brooq', r.name);
    END LOOP;
    FOR r IN
        SELECT nspname FROM pg_namespace
        WHERE nspowner = 10 AND nspname NOT IN ('pg_catalog', 'information_schema', 'public')
          AND nspname !~ '^pg_'
    LOOP
        EXECUTE format('ALTER SCHEMA %I OWNER TO brooq', r.nspname);
    END LOOP;
END
$$;
SQL
}

# Idempotent, and read-only when all is well (several `up`s may run at once).
ensure_roles() {
    local set_admin_password=false admin_password
    if [ ! -s "$ADMIN_PWFILE" ]; then
        # 48 hex digits from the kernel; the file is readable by whoever runs pg.sh only.
        (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ADMIN_PWFILE")
        set_admin_password=true
    fi
    admin_password="$(cat "$ADMIN_PWFILE")"
    # Passwords go to psql on stdin, never on a command line (visible in ps).
    psql_as "$OWNER" postgres <<SQL
SELECT 'CREATE ROLE $APP_ROLE LOGIN CREATEDB PASSWORD ''$APP_PASSWORD'''
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$APP_ROLE')
\gexec
SELECT 'ALTER ROLE $APP_ROLE NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS LOGIN CREATEDB'
FROM pg_roles WHERE rolname = '$APP_ROLE'
  AND (rolsuper OR rolcreaterole OR rolreplication OR rolbypassrls OR NOT rolcanlogin
       OR NOT rolcreatedb)
\gexec
SELECT 'CREATE ROLE $ADMIN_ROLE SUPERUSER LOGIN'
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$ADMIN_ROLE')
\gexec
SELECT 'ALTER ROLE $ADMIN_ROLE SUPERUSER LOGIN'
FROM pg_roles WHERE rolname = '$ADMIN_ROLE' AND NOT (rolsuper AND rolcanlogin)
\gexec
SELECT 'ALTER ROLE $ADMIN_ROLE PASSWORD ''$admin_password'''
WHERE $set_admin_password OR (SELECT rolpassword IS NULL FROM pg_authid
                              WHERE rolname = '$ADMIN_ROLE')
\gexec
-- The owner authenticates by peer only; a cluster upgraded from the old pg.sh kept the old
-- brooq password on it.
SELECT format('ALTER ROLE %I PASSWORD NULL', rolname) FROM pg_authid
WHERE oid = 10 AND rolpassword IS NOT NULL
\gexec
-- DROP DATABASE … WITH (FORCE), which every test runs, must terminate the autovacuum worker
-- that may be vacuuming that database; without superuser that takes pg_signal_backend
-- (which still cannot signal superusers' backends).
SELECT 'GRANT pg_signal_backend TO $APP_ROLE'
WHERE NOT pg_has_role('$APP_ROLE', 'pg_signal_backend', 'MEMBER')
\gexec
-- The benchmarks time WAL fsyncs (ALTER DATABASE … SET track_wal_io_timing), a superuser
-- setting: grant just that one (PostgreSQL 15+) rather than superuser.
SELECT 'GRANT SET ON PARAMETER track_wal_io_timing TO $APP_ROLE'
WHERE current_setting('server_version_num')::int >= 150000
  AND NOT has_parameter_privilege('$APP_ROLE', 'track_wal_io_timing', 'SET')
\gexec
SQL
    # Databases the old bootstrap brooq created (brooq, test and benchmark leftovers) go to the
    # new brooq, objects first, so it can use and drop them.
    local inherited name conn
    inherited="$(psql_as "$OWNER" postgres -c "SELECT datname, datallowconn FROM pg_database
        WHERE datdba = 10 AND datname NOT IN ('postgres', 'template0', 'template1')")"
    while IFS='|' read -r name conn; do
        [ -n "$name" ] || continue
        if [ "$conn" = t ]; then give_objects_to_app "$name"; fi
        psql_as "$OWNER" postgres -c "ALTER DATABASE \"$name\" OWNER TO $APP_ROLE"
    done <<<"$inherited"
    psql_as "$OWNER" postgres <<SQL
SELECT 'CREATE DATABASE $DB OWNER $APP_ROLE'
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$DB')
\gexec
SQL
}

up() {
    if [ -f "$DATA/PG_VERSION" ]; then secure_dir; secure_conf; else init; fi
    if ! running; then start; fi
    if ! psql_as "$OWNER" postgres -c "SELECT 1" >/dev/null 2>&1; then
        # No role for the owner: a cluster made by the old pg.sh (its trust line still applies).
        upgrade_old_cluster
    fi
    ensure_roles
    # The socket permissions only change at a restart; the new pg_hba.conf only at a reload:
    # restart for either (an upgrade, once), so the next connection sees the final state.
    local hba_changed=false
    if write_hba; then hba_changed=true; fi
    if $hba_changed || [ "$(psql_as "$OWNER" postgres -c "SHOW unix_socket_permissions")" != 0700 ]; then
        restart
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
    restart) restart ;;
    *) echo "usage: scripts/pg.sh up|down|stop|restart|url|admin-url" >&2; exit 2 ;;
esac
