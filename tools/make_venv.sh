#!/usr/bin/env bash
# Create or update .venv idempotently (called by `make venv`).
#
# Usage: tools/make_venv.sh VENV_DIR STAMP_NAME
# Why a script and not a make recipe: several helpers run `make venv` at once, so the whole
# check-create-install sequence runs under flock(1), and the stamp is re-checked inside the lock.
# The venv is made from the real CPython 3.11 (not the pyenv shim, which costs ~100 ms a start and
# can resolve to another version); HOSTLOCK_PYTHON overrides the choice.
set -euo pipefail

venv=${1:?venv dir}
stamp_name=${2:?stamp name}
stamp="$venv/$stamp_name"
lockfile="${venv%/}.lock"

find_python() {
    local candidate real
    if [[ -n "${HOSTLOCK_PYTHON:-}" ]]; then
        echo "$HOSTLOCK_PYTHON"; return
    fi
    # python3.11 on PATH may be a pyenv shim: ask the interpreter for its real path.
    for candidate in python3.11 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11*/bin/python3.11 /usr/bin/python3.11 /usr/bin/python3; do
        if real=$("$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 11); print(sys.executable)' 2>/dev/null) \
                && [[ -n "$real" && -x "$real" ]]; then
            echo "$real"; return
        fi
    done
    echo "make venv: no CPython 3.11 found (tried python3.11, pyenv 3.11.x, /usr/bin/python3.11, /usr/bin/python3);" \
         "install python3.11 (apt-get install python3.11-venv) or set HOSTLOCK_PYTHON=/path/to/python3.11" >&2
    return 1
}

[[ -f "$stamp" ]] && exit 0

mkdir -p "$(dirname "$lockfile")"
exec 9>"$lockfile"
flock 9
[[ -f "$stamp" ]] && exit 0   # another make finished it while we waited

# A venv whose interpreter is gone or is not 3.11 is rebuilt from scratch.
if [[ -e "$venv" ]] && ! "$venv/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    echo "make venv: $venv is broken or not Python 3.11: recreating it"
    rm -rf "$venv"
fi
if [[ ! -x "$venv/bin/python" ]]; then
    python=$(find_python)
    echo "make venv: creating $venv from $python"
    "$python" -m venv "$venv"
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
run_quiet() {
    # pip's own warnings (deprecations, unreachable local indexes) are noise here: show them only on failure.
    local out
    if ! out=$("$@" 2>&1); then
        printf '%s\n' "$out" >&2
        echo "make venv: failed: $*" >&2
        return 1
    fi
}
echo "make venv: installing requirements/dev.txt"
run_quiet "${pip[@]}" install -r requirements/dev.txt
# Editable so tests always run the working tree's plugins/module_utils/hostlock; "compat" mode puts a plain path in a
# .pth file (no import hook at interpreter start, which matters for the CLI's start-up budget).
# --no-build-isolation: setuptools comes pinned from dev.txt, no extra download.
echo "make venv: installing hostlock (editable: import hostlock -> $(pwd)/plugins/module_utils/hostlock)"
run_quiet "${pip[@]}" install --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
# compat mode puts the project root in its .pth, and the package lives under plugins/module_utils (pyproject's
# package-dir): one more .pth puts that directory on sys.path, still a plain path and no import hook.
site_packages=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$(pwd)/plugins/module_utils" >"$site_packages/hostlock-source.pth"
rm -f "$venv"/.stamp-*
touch "$stamp"
echo "make venv: $venv ready"
