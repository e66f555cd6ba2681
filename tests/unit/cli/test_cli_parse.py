"""In-process unit tests of the command line's pure parts: option parsing, names, messages, exit codes."""

import errno
import subprocess

import pytest

import hostlock
from hostlock.cli import common as c
from hostlock.cli import cron as cron_cli
from hostlock.cli import options, supervise


def parse(*args, cron=False):
    return options.parse(list(args), cron=cron)


def test_defaults():
    o = parse("name", "true")
    expected = ("name", ["true"], "exclusive", 1, None, None)
    assert (o.name, o.command, o.mode, o.slots, o.wait, o.conflict_code) == expected
    assert (o.timeout, o.kill_after, o.pgroup, o.verbose, o.quiet) == (None, 10.0, "auto", False, False)


def test_parsing_stops_at_the_command():
    o = parse("-n", "name", "cmd", "-x", "--", "-w", "5")
    assert o.wait == 0.0 and o.command == ["cmd", "-x", "--", "-w", "5"] and o.mode == "exclusive"


def test_double_dash_before_the_name_ends_options():
    o = parse("-s", "--", "name", "-n", "x")
    assert o.name == "name" and o.command == ["-n", "x"] and o.wait is None and o.mode == "shared"


def test_options_after_the_name_and_dash_c():
    o = parse("name", "-w", "1.5", "-E", "1", "-c", "echo hi")
    assert (o.wait, o.conflict_code, o.command) == (1.5, 1, ["/bin/sh", "-c", "echo hi"])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["-w0.25", "n", "x"], 0.25),
        (["--wait=250ms", "n", "x"], 0.25),
        (["--wait", "1m", "n", "x"], 60.0),
        (["-nv", "n", "x"], 0.0),  # clustered short flags
    ],
)
def test_wait_spellings(args, expected):
    assert parse(*args).wait == expected


def test_long_options_may_be_abbreviated_when_unique():
    o = parse("--excl", "--time-l=3", "--kill=1", "--verb", "n", "x")
    assert (o.mode, o.timeout, o.kill_after, o.verbose) == ("exclusive", 3.0, 1.0, True)
    with pytest.raises(c.UsageError, match="ambiguous"):
        parse("--s", "n", "x")  # --shared, --slots


def test_flock_long_names():
    o = parse("--shared", "--nonblock", "--conflict-exit-code", "3", "n", "x")
    assert (o.mode, o.wait, o.conflict_code) == ("shared", 0.0, 3)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "missing lock NAME"),
        (["n"], "missing COMMAND"),
        (["-q=1", "n", "x"], "unknown option -="),
        (["--quiet=1", "n", "x"], "takes no value"),
        (["--time-limit", "0", "n", "x"], "more than 0"),
        (["--timeout", "5", "n", "x"], "use -w/--wait 5"),
        (["--time", "5", "n", "x"], "ambiguous"),
        (["--process-group", "mine", "n", "x"], "invalid mode"),
        (["--mechanism", "lockf", "n", "x"], "invalid mechanism"),
        (["-c", "a", "-c", "b", "n"], "given twice"),
        (["-c", " ", "n"], "non-empty"),
        (["-w", "1", "-n", "n", "x"], "cannot be used together"),
    ],
)
def test_usage_errors(args, message):
    with pytest.raises(c.UsageError, match=message):
        parse(*args)


def test_cron_defaults_to_not_waiting_and_takes_no_name_operand():
    o = parse("--name", "x", "cmd", "arg", cron=True)
    assert (o.name, o.wait, o.command, o.on_conflict, o.syslog) == ("x", 0.0, ["cmd", "arg"], "quiet", False)
    o = parse("--syslog-socket", "/s", "-w", "2", "cmd", cron=True)
    assert (o.syslog, o.syslog_socket, o.wait) == (True, "/s", 2.0)


def test_cron_only_options_are_not_run_options():
    with pytest.raises(c.UsageError, match="unknown option --on-conflict"):
        parse("--on-conflict", "fail", "n", "x")


def test_default_cron_name_is_stable_valid_and_distinct():
    a = cron_cli.default_cron_name(parse("/usr/local/bin/backup.sh", "--full", cron=True))
    assert a == cron_cli.default_cron_name(parse("--", "/usr/local/bin/backup.sh", "--full", cron=True))
    assert a.startswith("cron-backup.sh-") and hostlock.validate_name(a)
    b = cron_cli.default_cron_name(parse("/usr/local/bin/backup.sh", "--incremental", cron=True))
    assert a != b
    assert a == "cron-backup.sh-%08x" % cron_cli._fnv1a32(b"/usr/local/bin/backup.sh\0--full")
    s = cron_cli.default_cron_name(parse("-c", "/opt/my job.sh >/dev/null", cron=True))
    assert s.startswith("cron-my-")
    odd = cron_cli.default_cron_name(parse("-c", ".hidden ünïcode/", cron=True))
    assert hostlock.validate_name(odd)
    long = cron_cli.default_cron_name(parse("x" * 300, cron=True))
    assert len(long) <= 100 and hostlock.validate_name(long)


def test_fnv1a_known_vectors():
    assert cron_cli._fnv1a32(b"") == 0x811C9DC5
    assert cron_cli._fnv1a32(b"a") == 0xE40C292C
    assert cron_cli._fnv1a32(b"foobar") == 0xBF9CF968


@pytest.mark.parametrize(
    "arg, quoted",
    [("plain", "plain"), ("", "''"), ("two words", "'two words'"), ("it's", "'it'\"'\"'s'"), ("$HOME", "'$HOME'")],
)
def test_quote(arg, quoted):
    assert c.quote(arg) == quoted


@pytest.mark.parametrize("arg", ["a\nb", "tab\there", "it's\r\n", "back\\slash\n", "\x01\x7f9", "\x1bf\n'$HOME'"])
def test_a_word_with_control_characters_quotes_onto_one_line_and_pastes_back_into_bash(arg):
    quoted = c.quote(arg)
    assert quoted.startswith("$'") and "\n" not in quoted and all(" " <= ch != "\x7f" for ch in quoted)
    echoed = subprocess.run(["bash", "-c", "printf %s " + quoted], capture_output=True, check=True)
    assert echoed.stdout.decode() == arg  # bytes: text mode would turn \r\n into \n


def test_a_shell_command_with_a_stray_newline_is_refused_on_one_line():
    with pytest.raises(c.UsageError) as e:
        parse("-c", "0", "NAME", "\n")
    assert "\n" not in str(e.value) and "$'\\n'" in str(e.value)


@pytest.mark.parametrize(
    "seconds, text",
    [(0.0004, "0ms"), (0.25, "250ms"), (1.5, "1.5s"), (59, "59s"), (61, "1m01s"), (7260, "2h01m"), (90000, "1d01h")],
)
def test_format_span(seconds, text):
    assert c.format_span(seconds) == text


@pytest.mark.parametrize(
    "exc, code",
    [
        (hostlock.InvalidName("x"), 64),
        (hostlock.TokenError("x"), 77),
        (hostlock.LockDirectoryError("x", errno=errno.EACCES), 66),
        (hostlock.LockDirectoryError("x", errno=errno.EROFS), 73),
        (hostlock.LockFileError("x", errno=errno.ENOSPC), 73),
        (hostlock.LockFileError("x", errno=errno.ELOOP), 66),
        (hostlock.LockDirectoryError("x", errno=errno.EMFILE), 71),
        (hostlock.MechanismError("x"), 65),
        (hostlock.HostlockError("x", errno=errno.EPERM), 77),
        (hostlock.HostlockError("x"), 65),
        (PermissionError(errno.EPERM, "no"), 77),
        (OSError(errno.EIO, "io"), 71),
        (OSError(errno.EROFS, "ro"), 73),
        (ValueError("x"), 65),
    ],
)
def test_exit_codes(exc, code):
    assert c.error_exit_code(exc) == code


def test_describe_error_adds_the_directory_once():
    e = hostlock.LockDirectoryError("cannot use it", directory="/run/lock/hostlock")
    assert c.describe_error(e) == "cannot use it (/run/lock/hostlock)"
    e = hostlock.LockDirectoryError("cannot use /x", directory="/x")
    assert c.describe_error(e) == "cannot use /x"


def test_outcome_exit_codes():
    assert supervise.Outcome(3 << 8, False, 1.0, 1, False).exit_code() == 3
    assert supervise.Outcome(9, False, 1.0, 1, False).exit_code() == 137
    assert supervise.Outcome(15, True, 1.0, 1, False).exit_code() == 124
    described = supervise.Outcome(9, True, 61.0, 1, False).describe()
    assert described == "timed out, killed by signal 9 (SIGKILL) after 1m01s"


@pytest.mark.parametrize("value", [" 3", "1_0", "\u0663", "+3", "0", "3 "])
def test_slots_take_plain_ascii_digits_only(value):
    with pytest.raises(c.UsageError, match="--slots: invalid count"):
        parse("--slots", value, "name", "true")
    assert parse("--slots", "3", "name", "true").slots == 3
