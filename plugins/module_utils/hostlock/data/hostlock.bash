# bash completion for hostlock(1): commands, each command's options, lock names, files for flock/--path.
# Installed by the hostlock.core.cli role as /usr/local/share/bash-completion/completions/hostlock.

_hostlock_names() {
    # Lock names from the lock directory (what 'hostlock list' would show), without running Python.
    # Not for fleet locks: listing them means asking etcd, too slow for a key press.
    local dir=${HOSTLOCK_DIR:-/run/hostlock} f
    [[ -d $dir ]] || return 0
    for f in "$dir"/*.lock; do
        [[ -e $f ]] || continue
        f=${f##*/}
        printf '%s\n' "${f%.lock}"
    done
}

_hostlock() {
    local cur prev words cword
    if declare -F _init_completion >/dev/null; then
        _init_completion || return
    else
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD - 1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    fi
    local commands="run flock cron status list history hold renew release break gc"
    if ((cword == 1)); then
        mapfile -t COMPREPLY < <(compgen -W "$commands --help --version" -- "$cur")
        return
    fi
    local opts
    case ${words[1]} in
        run) opts="--path -x -e --exclusive -s --shared --slots -n --nb --nonblock -w --wait -E --conflict-exit-code
                   -d --dir --mechanism --label -c --command --time-limit --kill-after --process-group -q --quiet
                   --fleet --ttl --fleet-password-file --replace --metrics-dir --history --job -v --verbose -h --help" ;;
        flock) opts="-s --shared -x -e --exclusive -u --unlock -n --nb --nonblocking -w --wait --timeout
                     -E --conflict-exit-code -o --close -c --command -F --no-fork --fcntl --start --length
                     --verbose -h --help -V --version --process-group" ;;
        cron) opts="--name --path --on-conflict -E --conflict-exit-code -w --wait -n --nb --nonblock --time-limit
                    --kill-after --syslog --syslog-socket -x -s --slots -d --dir --mechanism --label
                    --process-group -c --command --fleet --ttl --fleet-password-file --replace --metrics-dir --history
                    --job -v --verbose -h --help" ;;
        status) opts="--path --json --format --wide -d --dir --fleet -h --help" ;;
        history) opts="--json --since -n --lines --user -h --help" ;;
        list) opts="--json --wide -d --dir --fleet -h --help" ;;
        hold) opts="--lease -x -e --exclusive -s --shared --slots -n --nb --nonblock -w --wait -E
                    --conflict-exit-code --mechanism --label -d --dir --fleet --json -h --help" ;;
        renew) opts="--lease -d --dir --fleet --json -h --help" ;;
        release) opts="-d --dir --fleet --json -h --help" ;;
        break) opts="--force -d --dir --fleet --json -h --help" ;;
        gc) opts="--older-than -n --dry-run -d --dir --json -h --help" ;;
        *) return ;;
    esac
    case $prev in
        -d | --dir | --path | --metrics-dir)
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
            return ;;
        --mechanism)
            mapfile -t COMPREPLY < <(compgen -W "auto ofd flock record" -- "$cur")
            return ;;
        --process-group)
            mapfile -t COMPREPLY < <(compgen -W "auto new same" -- "$cur")
            return ;;
        --format)
            mapfile -t COMPREPLY < <(compgen -W "text json openmetrics" -- "$cur")
            return ;;
        --on-conflict)
            mapfile -t COMPREPLY < <(compgen -W "quiet report fail" -- "$cur")
            return ;;
        --fleet)
            [[ -n ${HOSTLOCK_FLEET:-} ]] && mapfile -t COMPREPLY < <(compgen -W "$HOSTLOCK_FLEET" -- "$cur")
            return ;;
        -w | --wait | --timeout | --time-limit | --kill-after | --lease | --older-than | -E | --conflict-exit-code | --slots \
            | --label | -c | --command | --start | --length | --name | --syslog-socket | --ttl | --job | --since | --lines \
            | --user)
            return ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return
    fi
    case ${words[1]} in
        flock)
            # FILE|DIR or FD first, then the command
            mapfile -t COMPREPLY < <(compgen -f -- "$cur"; compgen -c -- "$cur") ;;
        run | status | history | hold | renew | release | break)
            mapfile -t COMPREPLY < <(_hostlock_names | grep -- "^$cur" ; [[ ${words[1]} == run ]] && compgen -c -- "$cur") ;;
        cron)
            mapfile -t COMPREPLY < <(compgen -c -- "$cur") ;;
    esac
}

complete -F _hostlock hostlock
