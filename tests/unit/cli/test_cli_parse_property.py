"""Property-based: no command line makes a parser raise anything but its own usage error (hypothesis).

In-process and free of I/O: `run`/`cron` (`_cli_options.parse`), `flock` (`_cli_flock.parse`) and the
admin commands' argparse parsers. The same grammar runs the real command in
tests/integration/cli/test_cli_args_property.py.
"""

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hostlock.cli import admin, flock, options  # noqa: E402
from hostlock.cli import common as c  # noqa: E402
from hostlock.core.names import MAX_DURATION  # noqa: E402

# Values that have broken parsers before (issue 8 item 8) or sit on a boundary, and any text at all.
AWKWARD = ["0", "1", "-1", "1e10", "1e300", "1e400", "-1e400", "nan", "NaN", "inf", "-inf", "250ms", "1h30m",
           "5m", "0.0001", "99999999999999999999", "2147483.647", "2147483.648", "", " ", "-", "--", "=",
           "1025", "0x10", "١٢", "1_000", "auto", "new", "same", "ofd", "record", "quiet", "fail"]
VALUE = st.one_of(st.sampled_from(AWKWARD), st.text(max_size=12))

RUN_FLAGS = ["-x", "-e", "-s", "-n", "-q", "-v", "-h", "--exclusive", "--shared", "--nb", "--nonblock",
             "--no-wait", "--quiet", "--verbose", "--help", "--", "-xn", "-nv", "--ex", "--s"]
RUN_VALUED = ["-w", "--wait", "-E", "--conflict-exit-code", "--slots", "--time-limit", "--kill-after",
              "--timeout", "--process-group", "--mechanism", "--label", "-c", "--command", "-d", "--dir",
              "--path", "--name", "--on-conflict", "--syslog-socket", "--syslog"]
FLOCK_FLAGS = ["-s", "-x", "-e", "-u", "-n", "-o", "-F", "--fcntl", "--verbose", "-h", "-V", "--", "-sn"]
FLOCK_VALUED = ["-w", "--timeout", "-E", "--conflict-exit-code", "-c", "--command", "--start", "--length",
                "--process-group"]
ADMIN_FLAGS = ["--json", "--force", "-n", "--verbose", "-h"]
ADMIN_VALUED = ["-d", "--dir", "--lease", "-w", "--wait", "-E", "--older-than", "--label", "--path",
                "--conflict-exit-code", "--slots", "--mechanism"]


def words(flags, valued):
    """A command line: options (with values, glued or not), operands, any text, in any order."""

    def glued(t):
        return ["%s=%s" % t if t[0].startswith("--") else t[0] + t[1]]

    word = st.one_of(
        st.sampled_from(flags).map(lambda f: [f]),
        st.tuples(st.sampled_from(valued), VALUE).map(list),
        st.tuples(st.sampled_from(valued), VALUE).map(glued),
        st.sampled_from(["NAME", "a", "../x", "x" * 101, "true", "sh", "FILE", "3"]).map(lambda w: [w]),
        VALUE.map(lambda v: [v]),
    )
    return st.lists(word, max_size=8).map(lambda ws: [w for group in ws for w in group])


@settings(max_examples=500, deadline=None)
@given(args=words(RUN_FLAGS, RUN_VALUED), cron=st.booleans())
def test_run_and_cron_parse_any_command_line_or_say_why(args, cron):
    try:
        o = options.parse(args, cron=cron)
    except c.UsageError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert o.help or o.command
    if not o.help:
        assert o.command[0]  # an empty command word is refused, never run
        for seconds in (o.timeout, o.wait, o.kill_after):  # what the platform can honour, or refused
            assert seconds is None or 0 <= seconds <= MAX_DURATION


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=words(FLOCK_FLAGS, FLOCK_VALUED))
def test_flock_parses_any_command_line_or_exits_with_a_code(args, capsys):
    try:
        flock.parse(args)
    except flock._Exit as exc:
        assert isinstance(exc.code, int) and 0 <= exc.code <= 255
    capsys.readouterr()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["status", "list", "hold", "renew", "release", "break", "gc"]),
       args=words(ADMIN_FLAGS, ADMIN_VALUED))
def test_admin_commands_parse_any_command_line_or_exit_64(command, args, capsys):
    try:
        admin._build(command).parse_args(args)
    except SystemExit as exc:
        assert exc.code in (0, c.EX_USAGE)  # --help, or one usage line
    capsys.readouterr()
