"""Property-based, real processes: the installed command, given any command line from the grammar of
tests/unit/cli/test_cli_parse_property.py, never prints a traceback; a usage error is one line and 64.

Bounded (a few dozen runs per command): each example starts the real interpreter. Lock directories and
--path files stay inside the test's temporary directory; the only command run is `true`.
"""

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10)
AWKWARD = ["0", "1", "-1", "1e10", "1e300", "1e400", "nan", "inf", "-inf", "250ms", "1h30m", "0.05", "",
           " ", "-", "99999999999999999999", "2147483.648", "1025", "auto", "new", "same", "ofd", "record",
           "flock", "report", "fail"]
VALUE = st.one_of(st.sampled_from(AWKWARD), SAFE_TEXT)
RUN_FLAGS = ["-x", "-s", "-n", "-q", "-v", "--shared", "--nb", "--", "-xn"]
RUN_VALUED = ["-w", "-E", "--slots", "--time-limit", "--kill-after", "--timeout", "--process-group",
              "--mechanism", "--label", "--on-conflict", "--name"]
ADMIN_FLAGS = ["--json", "--force", "-n"]
ADMIN_VALUED = ["-w", "-E", "--older-than", "--lease", "--label"]
NAMES = st.one_of(st.sampled_from(["a", "b.c", "../x", "x" * 101, "", "-n", "--"]), SAFE_TEXT)


def line(flags, valued):
    word = st.one_of(st.sampled_from(flags).map(lambda f: [f]), st.tuples(st.sampled_from(valued), VALUE).map(list))
    return st.lists(word, max_size=5).map(lambda ws: [w for group in ws for w in group])


def check(r):
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode >= 0, r  # hostlock itself never dies of a signal here
    if r.returncode == 64:
        assert r.stderr.startswith("hostlock: ") and r.stderr.count("\n") == 1, r.stderr


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(opts=line(RUN_FLAGS, RUN_VALUED), name=NAMES, where=st.sampled_from(["dir", "path", "none"]))
def test_run_never_tracebacks(cli, tmp_path, opts, name, where):
    place = {"dir": ["-d", str(tmp_path / "locks")], "path": ["--path", str(tmp_path / "file")], "none": []}
    args = ["run", *place[where], *opts] + ([] if where == "path" else [name]) + ["true"]
    check(cli.run(*args, cwd=tmp_path))


@SETTINGS
@given(opts=line(RUN_FLAGS, RUN_VALUED))
def test_cron_never_tracebacks(cli, tmp_path, opts):
    check(cli.run("cron", *opts, "--", "true", cwd=tmp_path))


@SETTINGS
@given(command=st.sampled_from(["status", "list", "break", "gc", "renew", "release"]),
       opts=line(ADMIN_FLAGS, ADMIN_VALUED), name=NAMES)
def test_admin_commands_never_traceback(cli, tmp_path, command, opts, name):
    operands = {"status": [name], "list": [], "break": [name], "gc": [], "renew": [name, "tok.en"],
                "release": [name, "tok.en"]}[command]
    check(cli.run(command, *opts, *operands, cwd=tmp_path))
