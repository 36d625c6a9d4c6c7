#!/usr/bin/env bash
# Runs weir's whole test suite on a fresh machine: checks formatting and
# lints, runs every test (unit, integration, conformance, doc tests), and
# runs the quickstart end to end in a temporary lake.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# Incremental artifacts would only grow the build on a fresh clone, where
# every crate is compiled once; the build's disk use is the run's largest.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
disk() { df -hP . | awk 'NR == 2 { print "disk: " $4 " free of " $2 }'; }

if ! cargo nextest --version >/dev/null 2>&1; then
    step "installing cargo-nextest"
    cargo install cargo-nextest --locked
fi

step "independent readers (Python deltalake, pyiceberg, DuckDB) in .venv-readers"
requirements=integration/readers/requirements.txt
stamp=.venv-readers/.installed
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
    python3 -m venv .venv-readers
    .venv-readers/bin/pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
fi

step "services: SeaweedFS (S3) and PostgreSQL"
services=$(mktemp -d)
cleanup() {
    disk || true
    du -sh target 2>/dev/null || true
    scripts/services/seaweedfs.sh stop "$services" || true
    scripts/services/postgres.sh stop "$services" || true
    rm -rf "$services" "${lake:-}" || true
}
trap cleanup EXIT
eval "$(scripts/services/seaweedfs.sh start "$services")"
eval "$(scripts/services/postgres.sh start "$services")"

step "before the build"
disk || true

step "formatting"
cargo fmt --all -- --check

step "lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "doc tests"
cargo test --workspace --doc --locked

step "quickstart, twice on one lake (the second run continues the first)"
lake=$(mktemp -d)
cargo run --locked -q -p weir-examples --bin quickstart -- --lake "$lake" --batches 5 --rows-per-batch 1000
cargo run --locked -q -p weir-examples --bin quickstart -- --lake "$lake" --batches 3 --rows-per-batch 1000

step "tests"
cargo nextest run --workspace --locked --no-fail-fast

step "all checks passed"
