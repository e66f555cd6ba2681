"""Bad input to the admin commands and the shared option parsers (an outside fuzz round, 2,647 variants): the
documented exit code and one clear line, never a lock taken somewhere else, never a value a C tool refuses."""


import pytest


def one_line(r, code, *words):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["status"], ["list"], ["hold", "x", "--lease", "1m"], ["renew", "x", "t"],
                                  ["release", "x", "t"], ["break", "x"], ["gc"]], ids=lambda a: a[0])
def test_an_empty_dir_is_a_usage_error_not_the_default_directory(cli, tmp_path, args):
    """`hostlock hold X -d "$UNSET"` took a lock in $HOSTLOCK_DIR or /run/hostlock; `run -d ''` already said 64."""
    env = dict(cli.env)
    env.pop("HOSTLOCK_DIR")
    r = cli.run(*args, "-d", "", env=env)
    one_line(r, 64, "-d needs a directory")


@pytest.mark.parametrize("command", [["gc"], ["break", "x"], ["status"], ["list"]], ids=lambda a: a[0])
@pytest.mark.parametrize("kind", ["missing", "a-file"])
def test_an_explicit_dir_that_is_no_directory_is_66(cli, tmp_path, command, kind):
    """gc and break said "0 of 0 removed" / "nothing to remove" (exit 0) for a typo, where status said 66."""
    where = tmp_path / "nowhere"
    if kind == "a-file":
        where.write_text("")
    r = cli.run(*command, "-d", str(where))
    one_line(r, 66, "does not exist" if kind == "missing" else "is not a directory")


def test_hold_shared_with_slots_is_a_usage_error(cli):
    one_line(cli.run("hold", "x", "--lease", "1m", "-s", "--slots", "2"), 64, "--slots and --shared")
    assert cli.run("run", "-n", "x", "true").returncode == 0  # nothing taken


@pytest.mark.parametrize("value", ["\u0665", "1_0", " 5", "5 ", "5\n", "0x5", ""])
@pytest.mark.parametrize("command", ["run", "cron", "hold"])
def test_a_conflict_code_is_ascii_decimal_digits(cli, command, value):
    """int() reads other scripts' digits, `_` and surrounding space: `-E ٥` exited 5 on conflict. A C tool
    (flock(1)'s -E) refuses them, as hostlock's durations already did."""
    tail = {"run": ["x", "true"], "cron": ["x", "true"], "hold": ["x", "--lease", "1m"]}[command]
    one_line(cli.run(command, "-E", value, *tail), 64, "invalid exit code")


def test_a_conflict_code_with_a_sign_still_parses(cli):
    holder = cli.start("run", "x", "sleep", "300")
    try:
        cli.wait_held("x")
        assert cli.run("run", "-n", "-E", "+9", "x", "true").returncode == 9
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("host", ["-bad", "bad-", "a.-b", "a-.b"])
def test_a_fleet_host_label_that_begins_or_ends_with_a_dash_is_64_before_any_lookup(cli, host):
    """RFC 1123: `etcd://-bad:1` was looked up (the resolver said "Name or service not known", 76)."""
    one_line(cli.run("run", "--fleet", f"etcd://{host}:1", "-n", "x", "true"), 64, "begins or ends with '-'")


def test_flock_messages_stay_one_line(cli):
    r = cli.run("flock", "--process-group", "a\nb\x1b[31m", "f", "true")
    assert r.returncode == 64 and "\x1b" not in r.stderr and "a\\x0ab" in r.stderr, r.stderr
    assert r.stderr.splitlines()[0].endswith("use same, new, auto"), r.stderr


def test_bidi_and_c1_controls_are_escaped_in_status(cli):
    """U+202E reorders the rest of a terminal line (a label that forges the row after it); 0x9b is CSI."""
    holder = cli.start("run", "--label", "ok\u202eDLROW \x9b2J", "x", "sleep", "300")
    try:
        cli.wait_held("x")
        out = cli.run("status", "x").stdout
        assert "\u202e" not in out and "\x9b" not in out and "\\u202e" in out and "\\x9b" in out, out
    finally:
        holder.kill()
        holder.wait()
