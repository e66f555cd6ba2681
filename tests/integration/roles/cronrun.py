"""Run the job of a /etc/cron.d file the way cron(8) would, N copies at once (roles/cron's molecule verify).

Copied to the target by ansible.builtin.script. Why not wait for the cron daemon: its one-minute ticks make
"two copies at once" slow and unpredictable. What cron does for a cron.d entry is small and done here: the
file's NAME=value lines (matching quotes stripped), SHELL=/bin/sh, PATH=/usr/bin:/bin, HOME and LOGNAME from
the user's passwd entry; the command's unescaped % ends the command (the rest is stdin, % -> newline) and \\%
is a literal %; the command runs as `/bin/sh -c COMMAND` as the entry's user, with its output captured (cron
mails it).

usage: cronrun.py FILE [--copies N] [--detach LOGFILE]
prints JSON: {"line": ..., "user": ..., "runs": [{"pid", "rc", "output"}]} (--detach: {"pid"} without waiting)
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import subprocess
import sys
import tempfile

ENV_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse(path: str) -> tuple[dict[str, str], str, str]:
    """(environment, user, raw command) of the only job line in a cron.d file."""
    env: dict[str, str] = {}
    jobs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = ENV_LINE.match(line)
            if m and not line.lstrip().startswith("@"):
                value = m.group(2)
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                    value = value[1:-1]
                env[m.group(1)] = value
                continue
            fields = line.split(None, 2 if line.startswith("@") else 6)
            schedule_len = 1 if line.startswith("@") else 5
            if len(fields) != schedule_len + 2:
                sys.exit(f"cronrun: {path}: cannot parse job line {line!r}")
            jobs.append((fields[schedule_len], fields[schedule_len + 1]))
    if len(jobs) != 1:
        sys.exit(f"cronrun: {path}: expected exactly one active job line, found {len(jobs)}")
    user, command = jobs[0]
    return env, user, command


def split_percent(command: str) -> tuple[str, str | None]:
    """cron's % rule: the command ends at the first unescaped %; \\% is a literal %."""
    out = []
    i = 0
    while i < len(command):
        c = command[i]
        if c == "\\" and command[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if c == "%":
            return "".join(out), command[i + 1 :].replace("%", "\n")
        out.append(c)
        i += 1
    return "".join(out), None


def spawn(user: str, env: dict[str, str], command: str, stdin: str | None, output: int) -> subprocess.Popen:
    pw = pwd.getpwnam(user)
    full_env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin", "HOME": pw.pw_dir, "LOGNAME": pw.pw_name}
    full_env.update(env)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=pw.pw_dir if os.path.isdir(pw.pw_dir) else "/",
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid),
        start_new_session=True,
    )
    if stdin is not None and proc.stdin is not None:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description="run a cron.d file's job like cron would")
    parser.add_argument("file")
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--detach", metavar="LOGFILE", help="start one copy, print its pid, do not wait")
    args = parser.parse_args()

    env, user, raw = parse(args.file)
    command, stdin = split_percent(raw)
    if args.detach:
        fd = os.open(args.detach, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        proc = spawn(user, env, command, stdin, fd)
        os.close(fd)
        print(json.dumps({"pid": proc.pid, "user": user, "line": command}))
        return 0

    outputs = [tempfile.TemporaryFile() for _copy in range(args.copies)]
    procs = [spawn(user, env, command, stdin, out.fileno()) for out in outputs]
    runs = []
    for i, proc in enumerate(procs):
        out = outputs[i]
        rc = proc.wait(timeout=120)
        out.seek(0)
        runs.append({"pid": proc.pid, "rc": rc, "output": out.read().decode("utf-8", "replace")})
    print(json.dumps({"line": command, "user": user, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
