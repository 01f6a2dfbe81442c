#!/usr/bin/env bash
# Make sure the tests' PostgreSQL answers: postgresql://postgres@127.0.0.1:$PORT/test with
# trust authentication (tests/postgres.py). Nothing is done where one already answers;
# otherwise (as root) Debian's postgresql is installed if missing and a throwaway cluster
# is started in a temporary folder, owned by the postgres user.
# Usage: scripts/postgres.sh [PORT]   (default 5432)
set -euo pipefail
port="${1:-5432}"
ready() { pg_isready -q -h 127.0.0.1 -p "$port" 2>/dev/null; }
if command -v pg_isready >/dev/null 2>&1 && ready; then
  if ! psql -h 127.0.0.1 -p "$port" -U postgres -Atc "select 1" test >/dev/null 2>&1; then
    createdb -h 127.0.0.1 -p "$port" -U postgres test
  fi
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "the tests need PostgreSQL on 127.0.0.1:$port (user postgres, trust auth, database" \
    "test): sudo $0 starts one" >&2
  exit 1
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) \
    >/dev/null
fi
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
data="$(mktemp -d /tmp/meshfl-postgres.XXXXXX)"
chown postgres "$data"
as_postgres() { su postgres -s /bin/sh -c "$*"; }
as_postgres "$bin/initdb -D $data -A trust -U postgres" >/dev/null
as_postgres "$bin/pg_ctl -D $data -l $data/server.log -w start \
  -o '-p $port -k $data -c listen_addresses=127.0.0.1'" >/dev/null
as_postgres "$bin/createdb -h 127.0.0.1 -p $port -U postgres test"
ready
echo "PostgreSQL $(basename "$(dirname "$bin")") on 127.0.0.1:$port (data in $data)"
