"""hostlock.core.serialized: a run meant to be serialized never runs unserialized, whatever was misspelt.

Each case is a real ansible-playbook run with the setting as a user writes it (ansible.cfg or the
environment), ansible-core reading it as it does (issue 40 item 2).
"""

from __future__ import annotations

import pytest

SERIALIZE = "hostlock.core.serialize"


def _run(ansible, cfg: str, *args: str, **env):
    (ansible.work / "ansible.cfg").write_text(cfg)
    log = ansible.work / "guarded.log"
    log.unlink(missing_ok=True)
    env.setdefault("ANSIBLE_CALLBACKS_ENABLED", None)  # the ini decides, unless a case sets the variable
    run = ansible.play("guarded.yml", *args, extra_vars=dict(pattern="loc", log=str(log)),
                       HOSTLOCK_SERIALIZE_DIRECTORY=str(ansible.ctl_lockdir), **env)
    return run, log.exists()


CFG = "[defaults]\n"


@pytest.mark.parametrize("cfg,env,rc,says", [
    (CFG + f"callback_whitelist = {SERIALIZE}\n", {}, 2,
     "callback_whitelist in [defaults] of {cfg} is not read by ansible-core (2.15 removed it): rename it "
     "callbacks_enabled"),
    (CFG + "callbacks_enabled = hostlock.core.serialise\n", {}, 2,
     "callbacks_enabled ({cfg}) names 'hostlock.core.serialise', which is no callback: spell it " + SERIALIZE),
    (CFG, {"ANSIBLE_CALLBACKS_ENABLED": "hostlock.core.serialze"}, 2,
     "callbacks_enabled (env: ANSIBLE_CALLBACKS_ENABLED) names 'hostlock.core.serialze', which is no callback"),
    (CFG + f"callback_enabled = {SERIALIZE}\n", {}, 2,
     "callback_enabled in [defaults] of {cfg} is not read by ansible-core: set callbacks_enabled"),
    (CFG, {}, 2, f"the {SERIALIZE} callback is not enabled in this run (config file {{cfg}}"),
    (CFG + f"callbacks_enabled = {SERIALIZE}\n\n[hostlock-serialize]\ntimeout = 30m\n", {}, 64,
     "section [hostlock-serialize] in {cfg} is not read: the callback reads [hostlock_serialize]"),
    (CFG + f"callbacks_enabled = {SERIALIZE}\n\n[hostlock_serialize]\ntimout = 30m\n", {}, 64,
     "key 'timout' in [hostlock_serialize] of {cfg} names no option (did you mean timeout?)"),
    (CFG + f"callbacks_enabled = {SERIALIZE}\n", {"HOSTLOCK_SERIALIZE_TIMOUT": "30m"}, 64,
     "environment variable HOSTLOCK_SERIALIZE_TIMOUT names no option (did you mean timeout?)"),
], ids=["callback_whitelist", "misspelt-entry", "misspelt-env-entry", "misspelt-key", "missing",
        "misspelt-section", "misspelt-option-key", "misspelt-option-variable"])
def test_each_silent_misconfiguration_fails_the_run_with_one_line_naming_it(ansible, cfg, env, rc, says):
    run, ran = _run(ansible, cfg, **env)
    assert run.rc == rc, run.out
    expected = says.format(cfg=ansible.work / "ansible.cfg")
    # one line (ansible-core shows a failed task's msg twice: its error line and the result)
    assert any(expected in line for line in run.out.splitlines()), f"expected a line with {expected!r}:\n{run.out}"
    assert "Traceback" not in run.out
    assert not ran, "the play's work ran unserialized"


def test_the_right_setting_passes_and_names_the_lock(ansible):
    run, ran = _run(ansible, CFG + f"callbacks_enabled = {SERIALIZE}\n\n[hostlock_serialize]\ntimeout = 30m\n", "-v")
    assert run.rc == 0, run.out
    assert ran
    assert "hostlock.core.serialize holds lock ansible-host@loc for this run" in run.out, run.out


@pytest.mark.parametrize("given", ["ini", "env"])
def test_the_right_setting_passes_in_check_mode_too(ansible, given):
    if given == "ini":
        run, ran = _run(ansible, CFG + f"callbacks_enabled = {SERIALIZE}\n", "--check")
    else:
        run, ran = _run(ansible, CFG, "--check", ANSIBLE_CALLBACKS_ENABLED=SERIALIZE)
    assert run.rc == 0, run.out
    assert not ran, "check mode ran the shell task"
