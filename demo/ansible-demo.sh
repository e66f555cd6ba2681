#!/usr/bin/env bash
# make demo-ansible: the Ansible showcase, against this machine (localhost, local connection).
#
# 1. builds the collection with ansible-galaxy and installs it into a temporary collections path;
# 2. run A (demo/ansible/deploy.yml) holds the host's "deploy" lock across tasks: `hostlock status` names
#    the play, a cron-style `hostlock run -n deploy` is refused, one step runs under hostlock.core.locked;
# 3. run B (demo/ansible/report.yml) starts meanwhile against the same host: the hostlock.core.serialize
#    callback makes it wait for run A and says for whom; `hostlock status` on the control node shows it.
# Locks live in a temporary directory (HOSTLOCK_DIR), so the demo never touches the system's locks.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
bin="$repo/.venv/bin"
export PATH="$bin:$PATH"

work=$(mktemp -d "${TMPDIR:-/tmp}/hostlock-demo.XXXXXX")
pids=()
# shellcheck disable=SC2317  # reached through the EXIT trap, which shellcheck does not follow
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

python=/usr/bin/python3
[[ -x /root/.pyenv/versions/3.8.18/bin/python3 ]] && python=/root/.pyenv/versions/3.8.18/bin/python3

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
stamp() { while IFS= read -r line; do printf '%s %s %s\n' "$(date +%H:%M:%S.%N | cut -c1-12)" "$1" "$line"; done; }

step "building the collection and installing it from the tarball (as users get it)"
"$bin/ansible-galaxy" collection build "$repo" --output-path "$work" --force | sed 's/^/   /'
"$bin/ansible-galaxy" collection install --offline --force -p "$work/collections" "$work"/hostlock-core-*.tar.gz \
    2>/dev/null | tail -1 | sed 's/^/   /'

mkdir -m 0700 "$work/locks" "$work/controller-locks"
cat > "$work/inventory.ini" <<INV
demo ansible_connection=local ansible_python_interpreter=$python
INV
cat > "$work/ansible.cfg" <<CFG
[defaults]
inventory = $work/inventory.ini
collections_path = $work/collections
callbacks_enabled = hostlock.core.serialize
retry_files_enabled = false
deprecation_warnings = false

[hostlock_serialize]
directory = $work/controller-locks
CFG
export ANSIBLE_CONFIG="$work/ansible.cfg" HOSTLOCK_DIR="$work/locks" ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0

step "run A (deploy.yml) and, two seconds later, run B (report.yml) against the same host"
ansible-playbook "$here/ansible/deploy.yml" 2>&1 | stamp "[A]" &
pids+=($!)
sleep 2
ansible-playbook "$here/ansible/report.yml" 2>&1 | stamp "[B]" &
pids+=($!)
sleep 2
step "meanwhile, on the control node: hostlock status (run A holds the host, run B waits)"
hostlock status -d "$work/controller-locks" | sed 's/^/   /'
step "and on the host: hostlock status (run A's leases)"
hostlock status | sed 's/^/   /'
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
pids=()
step "after both runs: hostlock status on the host"
hostlock status | sed 's/^/   /'
exit $status
