#!/usr/bin/env bash
# make test-ansible-matrix: a real ansible-playbook smoke (tests/integration/matrix/smoke.yml) on every
# ansible-core in the tested range (meta/runtime.yml), each on the controller Python it needs:
#   2.19  Python 3.11  .venv itself (requirements/dev.txt)             managed host: Python 3.8
#   2.20  Python 3.12  .venv-ansible-2.20 (requirements/ansible-2.20.txt)  managed host: Python 3.9
#   2.21  Python 3.13  .venv-ansible-2.21 (requirements/ansible-2.21.txt)  managed host: Python 3.9
# The managed hosts get the oldest Python each ansible-core supports there, which is what docs/ansible.md
# states. The collection is built once from this checkout and installed into each run's own path with
# that version's ansible-galaxy. The versions run side by side (each has its own directories; the time
# is mostly interpreter start-up), each into its own log, printed when it fails.
#
# Usage: tools/ansible_matrix.sh [VERSION...]   (default: 2.19 2.20 2.21)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pyenv_root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(2.19 2.20 2.21)

# The newest pyenv CPython X.Y, else pythonX.Y on PATH: the real binary, not a shim.
find_python() {
    local v=$1 py
    py=$(printf '%s\n' "$pyenv_root"/versions/"$v".*/bin/python"$v" | sort -V | tail -n 1)
    if [[ ! -x "$py" ]]; then
        py=$(command -v "python$v" 2>/dev/null || true)
    fi
    [[ -n "$py" ]] && "$py" -c 'import sys; print(sys.executable)' 2>/dev/null
}

controller_python() { case $1 in 2.19) echo 3.11 ;; 2.20) echo 3.12 ;; 2.21) echo 3.13 ;; *) return 1 ;; esac; }
target_python() { case $1 in 2.19) echo 3.8 ;; *) echo 3.9 ;; esac; }

# The venv of one version, (re)made under flock when its requirements file is newer than its stamp.
venv_for() {
    local v=$1 venv req py
    if [[ $v == 2.19 ]]; then echo "$root/.venv"; return; fi
    venv="$root/.venv-ansible-$v"; req="$root/requirements/ansible-$v.txt"
    [[ -f "$req" ]] || { echo "test-ansible-matrix: no $req" >&2; return 1; }
    exec 8>"$venv.lock"; flock 8
    if [[ ! -f "$venv/.stamp" || "$req" -nt "$venv/.stamp" ]]; then
        py=$(find_python "$(controller_python "$v")") || {
            echo "test-ansible-matrix: ansible-core $v needs CPython $(controller_python "$v") (pyenv install it)" >&2; return 1; }
        rm -rf "$venv"
        "$py" -m venv "$venv" >&2
        "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req" >/dev/null 2>"$venv.pip.log" \
            || { cat "$venv.pip.log" >&2; return 1; }
        touch "$venv/.stamp"
    fi
    exec 8>&-
    echo "$venv"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/hostlock-matrix.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One tarball, built from the files a fresh clone has (tracked + untracked-not-ignored), with .venv's
# ansible-galaxy: what every version installs.
mkdir -p "$work/src/core" "$work/dist"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do if [[ -e "$f" ]]; then printf '%s\0' "$f"; fi; done \
  | tar --null --no-recursion -T - -cf - | tar -xf - -C "$work/src/core"
"$root/.venv/bin/ansible-galaxy" collection build --output-path "$work/dist" "$work/src/core" >/dev/null
tarball=$(ls "$work"/dist/hostlock-core-*.tar.gz)

run_one() {
    local v=$1 venv=$2 dir="$work/$1" target
    target=$(find_python "$(target_python "$v")") || target=/usr/bin/python3
    mkdir -p "$dir/locks" "$dir/ctl" "$dir/tmp"; chmod 700 "$dir/locks" "$dir/ctl"
    printf '[defaults]\ncallbacks_enabled = hostlock.core.serialize\n[hostlock_serialize]\ndirectory = %s\nfail_fast = true\n' \
        "$dir/ctl" >"$dir/ansible.cfg"
    printf 'smoke ansible_connection=local ansible_python_interpreter=%s\n' "$target" >"$dir/inventory"
    echo "ansible-core $v: $("$venv/bin/python" -V) controller, managed host $("$target" -V 2>&1)"
    env -u ANSIBLE_COLLECTIONS_PATH -u HOSTLOCK_DIR \
        ANSIBLE_CONFIG="$dir/ansible.cfg" ANSIBLE_LOCAL_TEMP="$dir/tmp" ANSIBLE_NOCOLOR=1 \
        "$venv/bin/ansible-galaxy" collection install -p "$dir/collections" "$tarball"
    env -u ANSIBLE_COLLECTIONS_PATH -u HOSTLOCK_DIR \
        ANSIBLE_CONFIG="$dir/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$dir/collections" ANSIBLE_LOCAL_TEMP="$dir/tmp" \
        ANSIBLE_NOCOLOR=1 ANSIBLE_DEPRECATION_WARNINGS=False PATH="$venv/bin:$PATH" \
        "$venv/bin/ansible-playbook" -i "$dir/inventory" "$root/tests/integration/matrix/smoke.yml" \
        -e "lockdir=$dir/locks ctl_lockdir=$dir/ctl expect_ansible=$v"
}

declare -A venvs
for v in "${versions[@]}"; do venvs[$v]=$(venv_for "$v"); done
for v in "${versions[@]}"; do
    (run_one "$v" "${venvs[$v]}" >"$work/$v.log" 2>&1; echo $? >"$work/$v.rc") &
done
wait
failed=""
for v in "${versions[@]}"; do
    rc=$(cat "$work/$v.rc")
    if [[ $rc != 0 ]]; then failed="$failed $v"; cat "$work/$v.log"; fi
    echo "test-ansible-matrix: ansible-core $v: $(if [[ $rc == 0 ]]; then echo passed; else echo "FAILED rc=$rc"; fi)" \
         "($(head -n 1 "$work/$v.log"); $(grep -E '^smoke +: ok=' "$work/$v.log" | tr -s ' ' || true))"
done
[[ -z "$failed" ]] || { echo "test-ansible-matrix: failed:$failed"; exit 1; }
