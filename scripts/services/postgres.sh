#!/usr/bin/env bash
# Starts a throwaway PostgreSQL on 127.0.0.1 for weir's tests (the Iceberg
# SQL catalog), or stops it. Installs the Debian package if it is missing.
#
#   scripts/services/postgres.sh start DIR   # prints the variables to export
#   scripts/services/postgres.sh stop DIR
set -euo pipefail
cd "$(dirname "$0")/../.."

cmd=${1:?start or stop}
dir=${2:?a working directory}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

bin_dir() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

# PostgreSQL refuses to run as root: run it as the postgres user then.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "$cmd" in
start)
    if [ -z "$(bin_dir)" ]; then
        echo "installing PostgreSQL" >&2
        scripts/apt-install.sh postgresql
    fi
    bin=$(bin_dir)
    port=$(free_port)
    mkdir -p "$dir/pg"
    if [ "$(id -u)" = 0 ]; then
        chmod 755 "$dir"
        chown postgres "$dir/pg"
    fi
    as_owner "$bin/initdb" -D "$dir/pg" -A trust -U postgres >"$dir/initdb.log" 2>&1 || {
        echo "initdb failed:" >&2
        cat "$dir/initdb.log" >&2
        exit 1
    }
    as_owner "$bin/pg_ctl" -D "$dir/pg" -l "$dir/pg/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/pg -c fsync=off" start >&2 || {
        echo "PostgreSQL did not start; its log:" >&2
        tail -20 "$dir/pg/server.log" >&2
        exit 1
    }
    echo "$bin" >"$dir/pg.bin"
    echo "export WEIR_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    if [ -f "$dir/pg.bin" ]; then
        as_owner "$(cat "$dir/pg.bin")/pg_ctl" -D "$dir/pg" -m fast -w stop >/dev/null 2>&1 || true
        rm -f "$dir/pg.bin"
    fi
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
