#!/usr/bin/env bash
# Starts Azurite (the Azure Storage emulator's blob service) on 127.0.0.1
# for weir's tests, with the container `weir`, or stops it. Azurite comes
# through npm, pinned by scripts/services/azurite/package-lock.json, and is
# kept in .cache/azurite for the next run.
#
#   scripts/services/azurite.sh start DIR   # prints the variables to export
#   scripts/services/azurite.sh stop DIR
set -euo pipefail
cd "$(dirname "$0")/../.."

cmd=${1:?start or stop}
dir=${2:?a working directory}
pinned=scripts/services/azurite
cache=.cache/azurite

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

install() {
    if cmp -s "$pinned/package-lock.json" "$cache/package-lock.json" 2>/dev/null &&
        [ -x "$cache/node_modules/.bin/azurite-blob" ]; then
        return
    fi
    command -v npm >/dev/null || scripts/apt-install.sh nodejs npm
    echo "installing Azurite through npm" >&2
    rm -rf "$cache"
    mkdir -p "$cache"
    cp "$pinned/package.json" "$pinned/package-lock.json" "$cache/"
    (cd "$cache" && npm ci --quiet --no-audit --no-fund --ignore-scripts >&2)
}

case "$cmd" in
start)
    install
    mkdir -p "$dir/azurite"
    port=$(free_port)
    "$cache/node_modules/.bin/azurite-blob" --blobHost 127.0.0.1 --blobPort "$port" \
        --location "$dir/azurite" --skipApiVersionCheck --silent \
        >"$dir/azurite.log" 2>&1 &
    echo $! >"$dir/azurite.pid"
    endpoint=http://127.0.0.1:$port
    for _ in $(seq 1 150); do
        python3 "$pinned/create-container.py" "$endpoint" weir 2>/dev/null && break
        sleep 0.2
    done
    if ! python3 "$pinned/create-container.py" "$endpoint" weir; then
        echo "Azurite did not start; its log:" >&2
        tail -20 "$dir/azurite.log" >&2
        exit 1
    fi
    # The account and key are Azurite's published development ones.
    echo "export WEIR_TEST_AZURE_ENDPOINT=$endpoint/devstoreaccount1"
    echo "export WEIR_TEST_AZURE_CONTAINER=weir"
    ;;
stop)
    if [ -f "$dir/azurite.pid" ]; then
        pid=$(cat "$dir/azurite.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        rm -f "$dir/azurite.pid"
    fi
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
