#!/usr/bin/env bash
# A disposable SSH target for the role scenarios (molecule create/destroy call this).
#
#   target.sh start WORKDIR   -> prints the port; sshd on 127.0.0.1 runs in a private mount namespace
#   target.sh stop WORKDIR    -> ends every process in that namespace, removes WORKDIR
#
# Why: the roles write to /etc (cron.d, tmpfiles.d, group), /usr/local and /run. In the namespace /etc and
# /usr/local are overlays whose writes land in WORKDIR, and /run, /tmp, /var/tmp, /home are empty tmpfs (a
# freshly booted host), so the roles run with their real default paths and this machine is left as it was.
set -euo pipefail

die() { echo "target.sh: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: target.sh start|stop WORKDIR"
action=$1
work=$(realpath -m "$2")
case "$work" in
    /tmp|/tmp/*|/var/tmp|/var/tmp/*|/run|/run/*|/home|/home/*|/etc|/etc/*|/usr/local|/usr/local/*)
        die "WORKDIR $work would be hidden inside the target: use a directory elsewhere (e.g. ~/.cache)";;
esac

sshd=/usr/sbin/sshd

# Every process whose mount namespace is the target's (the sshd and whatever the tests started through it).
namespace_pids() {
    local ns pid
    ns=$(readlink "/proc/$1/ns/mnt") || return 0
    for pid in /proc/[0-9]*; do
        pid=${pid#/proc/}
        [[ $(readlink "/proc/$pid/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "$pid"
    done
    return 0
}

stop() {
    local pid pids _
    if [[ -s "$work/sshd.pid" ]]; then
        pid=$(<"$work/sshd.pid")
        if [[ -d /proc/$pid && $(readlink "/proc/$pid/exe" 2>/dev/null) == "$sshd" ]]; then
            mapfile -t pids < <(namespace_pids "$pid")
            # Never our own namespace: that would mean the pid file points at a process outside the target.
            if [[ $(readlink "/proc/$pid/ns/mnt") != $(readlink /proc/self/ns/mnt) && ${#pids[@]} -gt 0 ]]; then
                kill -KILL "${pids[@]}" 2>/dev/null || true
                for _ in $(seq 50); do
                    kill -0 "${pids[@]}" 2>/dev/null || break
                    sleep 0.1
                done
            fi
        fi
    fi
    rm -rf "$work"
}

start() {
    [[ -x $sshd ]] || die "$sshd not found: install openssh-server (apt-get install openssh-server)"
    command -v unshare >/dev/null || die "unshare(1) not found: install util-linux"
    [[ $(id -u) -eq 0 ]] || die "must run as root (it mounts overlays in a private mount namespace)"
    stop
    mkdir -p "$work"/{etc.upper,etc.work,local.upper,local.work}
    chmod 700 "$work"
    ssh-keygen -q -t ed25519 -N '' -C hostlock-target-host -f "$work/host_key"
    ssh-keygen -q -t ed25519 -N '' -C hostlock-target-client -f "$work/client_key"
    cp "$work/client_key.pub" "$work/authorized_keys"
    local port
    port=$(/usr/bin/python3 -I -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cat >"$work/sshd_config" <<CONFIG
ListenAddress 127.0.0.1
Port $port
HostKey $work/host_key
PidFile $work/sshd.pid
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
Subsystem sftp internal-sftp
# Sessions get an empty home: root's ~/.bashrc here runs pyenv init, whose rehash waits up to a minute
# on a lock file that a session killed mid-login leaves behind (every later login would then hang).
SetEnv HOME=$work/home
CONFIG
    mkdir -p "$work/home"
    # The inner shell sets up the namespace; sshd then daemonizes and keeps it alive until stop.
    # shellcheck disable=SC2016  # the script is single-quoted on purpose: the inner shell expands $1 and $2
    unshare --mount --propagation private -- /bin/sh -euc '
        work=$1
        mount -t overlay overlay -o "lowerdir=/etc,upperdir=$work/etc.upper,workdir=$work/etc.work" /etc
        mount -t overlay overlay -o "lowerdir=/usr/local,upperdir=$work/local.upper,workdir=$work/local.work" /usr/local
        mount -t tmpfs -o mode=0755 hostlock-target-run /run
        mkdir -m 0755 /run/sshd
        mkdir -m 1777 /run/lock
        for d in /tmp /var/tmp; do mount -t tmpfs -o mode=1777 hostlock-target-tmp "$d"; done
        mount -t tmpfs -o mode=0755 hostlock-target-home /home
        exec "$2" -f "$work/sshd_config" -E "$work/sshd.log"
    ' target "$work" "$sshd" || die "could not start the target (see $work/sshd.log)"
    local _
    for _ in $(seq 100); do
        if [[ -s "$work/sshd.pid" ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port" >"$work/port"
            echo "$port"
            return 0
        fi
        sleep 0.1
    done
    die "sshd did not come up on 127.0.0.1:$port (see $work/sshd.log)"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) die "usage: target.sh start|stop WORKDIR" ;;
esac
