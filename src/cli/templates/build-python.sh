#!/usr/bin/env bash
# Builds {{NAME}}.wasm (beside {{NAME}}.cases.yaml) from app.py with componentize-py, the
# version vk-cocoon's own Python policies are built and tested with. The toolchain goes to
# $VK_POLICY_TOOLCHAINS/python (a venv; default .toolchains here): nothing is installed on
# the machine, and a toolchain of that version already there is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tools="${VK_POLICY_TOOLCHAINS:-$here/.toolchains}"
# Pinned: the toolchain decides what the guest's runtime does; change it deliberately.
componentize_py={{COMPONENTIZE_PY}}

python="$tools/python/bin/python"
if ! "$python" -m pip show componentize-py 2>/dev/null | grep -qx "Version: $componentize_py"; then
    [ -x "$python" ] || python3 -m venv "$tools/python"
    "$python" -m pip install --quiet --disable-pip-version-check "componentize-py==$componentize_py"
fi
# componentize-py leaves __pycache__ beside the sources it reads: build from a copy.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here"/*.py "$work/"
# --stub-wasi: the component imports no WASI (vk-cocoon grants none; a WASI call traps).
(cd "$work" && "$tools/python/bin/componentize-py" -d "$here/wit/vk-policy.wit" -w {{WORLD}} \
    componentize app -o "$here/{{NAME}}.wasm" --stub-wasi >/dev/null)
echo "built $here/{{NAME}}.wasm"
