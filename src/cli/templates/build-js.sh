#!/usr/bin/env bash
# Builds {{NAME}}.wasm (beside {{NAME}}.cases.yaml) from policy.js with componentize-qjs
# (QuickJS), the version vk-cocoon's own JavaScript policies are built and tested with. The
# toolchain goes to $VK_POLICY_TOOLCHAINS/js (an npm folder; default .toolchains here): nothing
# is installed on the machine, and a toolchain of that version already there is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tools="${VK_POLICY_TOOLCHAINS:-$here/.toolchains}"
# Pinned: the toolchain decides what the guest's runtime does; change it deliberately.
componentize_qjs={{COMPONENTIZE_QJS}}

qjs="$tools/js/node_modules/.bin/componentize-qjs"
if ! grep -q "\"version\": \"$componentize_qjs\"" "$tools/js/node_modules/componentize-qjs/package.json" 2>/dev/null; then
    mkdir -p "$tools/js"
    npm install --prefix "$tools/js" --no-audit --no-fund --no-save --silent "componentize-qjs@$componentize_qjs"
fi
# --sync: vk-cocoon runs components without the component-model async ABI (it refuses one that
# uses it); --stub-wasi: the component imports no WASI (none is granted; a WASI call traps).
"$qjs" --wit "$here/wit/vk-policy.wit" --js "$here/policy.js" -n {{WORLD}} --sync --stub-wasi \
    -o "$here/{{NAME}}.wasm" >/dev/null
echo "built $here/{{NAME}}.wasm"
