#!/usr/bin/env bash
# Checks an application that depends on weir as a user's does: a fresh
# lockfile every time, weir by path, compiled with weir's declared minimum
# Rust (a newer one resolves the same lockfile).
#
#   integration/downstream/check.sh [MSRV]
#
# MSRV is a toolchain rustup can install (default: the weir crate's
# rust-version).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
msrv=${1:-$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/crates/weir/Cargo.toml")}
manifest=$here/Cargo.toml
# Apart from the workspace's: another toolchain's artifacts are never shared.
target=${CARGO_TARGET_DIR:-$root/target}/msrv

rustup toolchain install "$msrv" --profile minimal >/dev/null
rm -f "$here/Cargo.lock"
cargo "+$msrv" generate-lockfile --manifest-path "$manifest"
derive=$(cargo "+$msrv" tree --manifest-path "$manifest" -i buoyant_kernel_derive --depth 0 -e normal)
echo "fresh lockfile: $derive"

# A check, not a build: what a fresh lockfile and the minimum Rust can
# break shows when the application and every dependency compile; running
# the same program is the workspace's own test of to_table on the
# embedded default (crates/weir/tests/to_table.rs), read back there by
# Python deltalake. A full build here would compile the whole tree a
# second time, on another toolchain, for about ten minutes of the suite.
echo "checking the application on Rust $msrv (the declared minimum)"
CARGO_TARGET_DIR="$target" cargo "+$msrv" check --manifest-path "$manifest"
rm -f "$here/Cargo.lock"
echo "the application and its dependencies, resolved afresh, compile on Rust $msrv"
