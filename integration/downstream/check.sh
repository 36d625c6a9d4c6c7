#!/usr/bin/env bash
# Builds and runs an application that depends on weir as a user's does:
# a fresh lockfile every time, weir by path, built with weir's declared
# minimum Rust (a newer one resolves the same lockfile). Then reads its
# table back with Python deltalake and checks every payment is there
# exactly once.
#
#   integration/downstream/check.sh PYTHON [MSRV]
#
# PYTHON has the independent readers (deltalake); MSRV is a toolchain
# rustup can install (default: the weir crate's rust-version).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${1:?a python with deltalake}
msrv=${2:-$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/crates/weir/Cargo.toml")}
manifest=$here/Cargo.toml
# Apart from the workspace's: another toolchain's artifacts are never shared.
target=${CARGO_TARGET_DIR:-$root/target}/msrv

rustup toolchain install "$msrv" --profile minimal >/dev/null
rm -f "$here/Cargo.lock"
cargo "+$msrv" generate-lockfile --manifest-path "$manifest"
derive=$(cargo "+$msrv" tree --manifest-path "$manifest" -i buoyant_kernel_derive --depth 0 -e normal)
echo "fresh lockfile: $derive"

echo "building the application on Rust $msrv (the declared minimum)"
CARGO_TARGET_DIR="$target" cargo "+$msrv" build --manifest-path "$manifest"
lake=$(mktemp -d)
trap 'rm -rf "$lake"; rm -f "$here/Cargo.lock"' EXIT
table=$(cd "$lake" && env -u WEIR_CONFIG -u WEIR_LAKE "$target/debug/weir-downstream")
"$python" - "$root/integration/readers" "$table" <<'PY'
import json, subprocess, sys
readers, table = sys.argv[1], sys.argv[2]
out = subprocess.run([sys.executable, f"{readers}/read_table.py", "ids", "deltalake", table],
                     check=True, capture_output=True, text=True).stdout
ids = json.loads(out)["ids"]
if sorted(ids) != list(range(3000)):
    sys.exit(f"the downstream table holds {len(ids)} rows, {len(set(ids))} distinct ids; expected ids 0..3000 once each")
print(f"downstream table read back by Python deltalake: {len(ids)} rows, every id once")
PY
