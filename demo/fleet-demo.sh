#!/usr/bin/env bash
# make demo-fleet: one lock shared by two "controllers" through etcd (docs/fleet.md, docs/cli.md "Fleet locks").
#
# A throwaway etcd starts on free ports with a temporary data directory and is stopped at the end. The two
# controllers are two `hostlock` processes with their own lock directories ($HOSTLOCK_DIR) that share nothing
# but the fleet URL, as two control nodes (or CI runners, or two admins' laptops) would:
# 1. A takes "deploy" and runs a job; `hostlock status --fleet` shows A's host, pid, job and fence;
# 2. B's `run -n` is refused (exit 75, naming A on its host); B's `run -w` queues behind A and runs after it,
#    with a greater fence in $HOSTLOCK_FENCE;
# 3. `hostlock break --force` from B revokes A's lease: A's job gets SIGTERM and A exits 79;
# 4. with etcd stopped, a run exits 76 within its wait, naming the endpoint.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export PATH="$repo/.venv/bin:$PATH"
command -v etcd >/dev/null || { echo "fleet demo: etcd is not installed (make etcd-deps)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/hostlock-fleet-demo.XXXXXX")
pids=()
etcd_pid=
# shellcheck disable=SC2317  # reached through the EXIT trap, which shellcheck does not follow
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [[ -n $etcd_pid ]]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
indent() { sed 's/^/   /'; }
free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for FILE: until a job wrote it (the demo's jobs say when they are inside the lock)
    while [[ ! -s $1 ]]; do sleep 0.05; done
}

step "a throwaway etcd on 127.0.0.1 (temporary data directory, free ports)"
client=$(free_port)
peer=$(free_port)
etcd --name demo --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "demo=http://127.0.0.1:$peer" \
    >"$work/etcd.log" 2>&1 &
etcd_pid=$!
until ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$client" endpoint health >/dev/null 2>&1; do
    kill -0 "$etcd_pid" 2>/dev/null || { cat "$work/etcd.log" >&2; exit 1; }
    sleep 0.1
done
export HOSTLOCK_FLEET="etcd://127.0.0.1:$client"
echo "   HOSTLOCK_FLEET=$HOSTLOCK_FLEET"
mkdir -m 0700 "$work/controller-a" "$work/controller-b"
a() { HOSTLOCK_DIR="$work/controller-a" hostlock "$@"; }
b() { HOSTLOCK_DIR="$work/controller-b" hostlock "$@"; }

# The jobs: small scripts, so that status shows them by name.
cat > "$work/deploy-a.sh" <<SH
#!/bin/sh
echo "[A] deploying, HOSTLOCK_FENCE=\$HOSTLOCK_FENCE"
echo x > $work/a-in
while [ ! -e $work/a-go ]; do sleep 0.05; done
echo "[A] done"
SH
cat > "$work/deploy-b.sh" <<'SH'
#!/bin/sh
echo "[B] deploying, HOSTLOCK_FENCE=$HOSTLOCK_FENCE (greater than A's)"
SH
cat > "$work/long-job.sh" <<SH
#!/bin/sh
trap 'echo "[A] SIGTERM: the lock is gone, stopping"; exit 0' TERM
echo "[A] long job, HOSTLOCK_FENCE=\$HOSTLOCK_FENCE"
echo x > $work/a2-in
while :; do sleep 0.05; done 2>/dev/null  # no "Terminated" from sh when SIGTERM ends the sleep
SH
chmod +x "$work"/*.sh

step "controller A: hostlock run deploy (its own lock directory, the shared fleet)"
a run --label "controller A" deploy "$work/deploy-a.sh" &
pids+=($!)
wait_for "$work/a-in"
b status deploy | indent

step "controller B: hostlock run -n deploy (do not wait)"
set +e
b run -n deploy -- echo "[B] never printed" 2>&1 | indent
echo "   exit status ${PIPESTATUS[0]} (75: busy; the line names A's pid on its host)"
set -e

step "controller B: hostlock run -w 1m deploy (waits in line behind A, woken by an etcd watch)"
b run -w 1m --label "controller B" deploy "$work/deploy-b.sh" &
b_pid=$!
pids+=("$b_pid")
until b status deploy --json | python -c 'import json,sys; sys.exit(json.load(sys.stdin)["locks"][0]["waiters"] < 1)'; do
    sleep 0.05
done
b list | indent
echo "   (A finishes)"
touch "$work/a-go"
wait "$b_pid"

step "a lost lock stops the job: B revokes A's lease with hostlock break --force"
a run deploy "$work/long-job.sh" &
a_pid=$!
wait_for "$work/a2-in"
b break --force deploy | indent
set +e
wait "$a_pid"
echo "   controller A exited $? (79: the fleet lock was lost while the job ran, whatever the job's status)"
set -e

step "etcd stopped: hostlock exits 76 within its wait, naming the endpoint"
kill "$etcd_pid"
wait "$etcd_pid" 2>/dev/null || true
etcd_pid=
set +e
a run -w 2s deploy true 2>&1 | indent
echo "   exit status ${PIPESTATUS[0]} (76: the fleet is unavailable)"
set -e
