#!/bin/bash
# Rebuilds the five default policies exactly as the daemon embedded them at contract 0.2.0
# (commit ce0c894, the last commit of that contract) and checks the bytes against SHA256SUMS.
#
#   tests/compat/v0.1.0/rebuild.sh          rebuild in a temp dir and compare (exit 1 on a mismatch)
#   tests/compat/v0.1.0/rebuild.sh --write  also copy the rebuilt components here
#
# Needs the repository's git history, rustc 1.95 with the wasm32-wasip2 target, and the
# crates of that commit's Cargo.lock. The build is reproducible: the guests embed no path of
# the checkout (only rustc's own), and the flags are the ones policies/artifacts/build.rs used.
set -euo pipefail
COMMIT=ce0c894
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$HERE" rev-parse --show-toplevel)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git -C "$REPO" archive "$COMMIT" | tar -x -C "$WORK"
(
  cd "$WORK"
  env -u RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS CARGO_ENCODED_RUSTFLAGS=-Clink-arg=-zstack-size=32768 \
    CARGO_TARGET_DIR="$WORK/target" cargo build --release --locked --target wasm32-wasip2 \
    -p snapshot-before-destroy-policy -p bring-up-policy -p cpu-class-admission-policy \
    -p resource-translation-policy -p guest-fixup-policy
)
OUT="$WORK/target/wasm32-wasip2/release"
mkdir -p "$WORK/built"
for slot in snapshot-before-destroy bring-up cpu-class-admission resource-translation guest-fixup; do
  cp "$OUT/${slot//-/_}_policy.wasm" "$WORK/built/$slot.wasm"
done
(cd "$WORK/built" && sha256sum -c "$HERE/SHA256SUMS")
if [ "${1:-}" = "--write" ]; then
  cp "$WORK"/built/*.wasm "$HERE/"
fi
