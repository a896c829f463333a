#!/bin/sh
# The read-only role Grafana's PostgreSQL datasource logs in as (deploy/grafana/provisioning/datasources/
# tokwatch-postgres.yaml): it may connect and SELECT from every table of the public schema, those tokwatch's
# migrations have created and those they will create, and nothing else (no INSERT/UPDATE/DELETE, no DDL;
# its sessions are read-only by default as well).
#
# The TimescaleDB image runs it once, as the database owner (POSTGRES_USER), when its volume is initialised
# (/docker-entrypoint-initdb.d). On a volume created before this file existed, run it by hand:
#   docker compose exec timescaledb sh /docker-entrypoint-initdb.d/100_grafana_reader.sh
# It is idempotent: a second run resets the password to GRAFANA_PG_PASSWORD and grants again.
set -e
if [ -z "${GRAFANA_PG_PASSWORD-}" ]; then
    echo "grafana-reader.sh: GRAFANA_PG_PASSWORD is not set" >&2
    exit 1
fi
# psql reads the password from the environment (\getenv, psql 15+) and quotes it itself: it never sits on a
# command line (ps) or passes through the shell into SQL text.
psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet --username "${POSTGRES_USER:-postgres}" \
    --dbname "${POSTGRES_DB:-${POSTGRES_USER:-postgres}}" <<'SQL'
\getenv reader_password GRAFANA_PG_PASSWORD
SELECT 'CREATE ROLE grafana_reader' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'grafana_reader')
\gexec
ALTER ROLE grafana_reader WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT
    PASSWORD :'reader_password';
ALTER ROLE grafana_reader SET default_transaction_read_only = on;
-- Nobody but the owner creates objects in public (the default since PostgreSQL 15; explicit for older ones).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT CONNECT ON DATABASE :"DBNAME" TO grafana_reader;
GRANT USAGE ON SCHEMA public TO grafana_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO grafana_reader;
-- Tables and views the owner (tokwatch, which runs the migrations) creates from now on.
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO grafana_reader;
SQL
echo "grafana-reader.sh: role grafana_reader can read database ${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
