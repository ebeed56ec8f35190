#!/usr/bin/env bash
# Builds the non-Rust example policies, and the test suite's probes of what each language's
# clock and random do inside a decision, with their toolchains pinned:
#   componentize-py (PyPI) for Python, componentize-qjs (npm, QuickJS) for JavaScript.
# The toolchains go to target/policy-toolchains (a venv and an npm folder: nothing is installed
# on the machine), the components to target/policy-examples (or $1). The test suite
# (tests/integration/policy/languages.rs) runs the Rust defaults' case tables against them.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/target/policy-examples}"
tools="$root/target/policy-toolchains"
# Pinned: a new version is a reviewed change (it decides what the guests' runtime does).
componentize_py=0.25.1
componentize_qjs=0.4.5
mkdir -p "$out" "$tools"

python="$tools/python/bin/python"
if ! "$python" -m pip show componentize-py 2>/dev/null | grep -qx "Version: $componentize_py"; then
    [ -x "$python" ] || python3 -m venv "$tools/python"
    "$python" -m pip install --quiet --disable-pip-version-check "componentize-py==$componentize_py"
fi
qjs="$tools/js/node_modules/.bin/componentize-qjs"
if ! grep -q "\"version\": \"$componentize_qjs\"" "$tools/js/node_modules/componentize-qjs/package.json" 2>/dev/null; then
    mkdir -p "$tools/js"
    npm install --prefix "$tools/js" --no-audit --no-fund --no-save --silent "componentize-qjs@$componentize_qjs"
fi

wit="$root/wit/vk-policy.wit"
build_py() { # SOURCE_DIR MODULE WORLD OUTPUT
    # componentize-py writes __pycache__ beside the sources: build from a copy under target/.
    local work="$tools/build/$(basename "$1")"
    rm -rf "$work" && mkdir -p "$work" && cp "$1"/*.py "$work/"
    # --stub-wasi: the component imports no WASI (the host grants none); a WASI call traps.
    (cd "$work" && "$tools/python/bin/componentize-py" -d "$wit" -w "$3" componentize "$2" -o "$4" --stub-wasi >/dev/null)
}
build_js() { # SOURCE WORLD OUTPUT [FLAG…]
    # --sync: the host runs components without the component-model async ABI.
    "$qjs" --wit "$wit" --js "$1" -n "$2" --stub-wasi -o "$3" "${@:4}" >/dev/null
}

started=$SECONDS
build_py "$root/policies/examples/snapshot-before-destroy-py" app snapshot-before-destroy-policy \
    "$out/snapshot-before-destroy-py.wasm"
build_js "$root/policies/examples/cpu-class-admission-js/policy.js" cpu-class-admission-policy \
    "$out/cpu-class-admission-js.wasm" --sync
build_py "$root/tests/guests/lang-probes" probe snapshot-before-destroy-policy "$out/probe-py.wasm"
build_js "$root/tests/guests/lang-probes/probe.js" cpu-class-admission-policy "$out/probe-js.wasm" --sync
# Without --sync (componentize-qjs's default): the test checks the host refuses it, saying why.
build_js "$root/tests/guests/lang-probes/probe.js" cpu-class-admission-policy "$out/probe-js-async.wasm"
echo "policy examples built in $((SECONDS - started)) s into $out:"
ls -l "$out"/*.wasm | awk '{print "  " $5 " bytes  " $9}'
