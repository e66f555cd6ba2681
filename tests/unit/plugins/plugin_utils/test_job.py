"""Unit tests for the AWX/AAP job a run belongs to: shown in labels, never able to pass for a run marker."""

from __future__ import annotations

from ansible_collections.hostlock.core.plugins.module_utils._common import RUN_MARKER
from ansible_collections.hostlock.core.plugins.plugin_utils._job import job_text


def test_awx_and_tower_names_alike():
    assert job_text(dict(awx_job_id=42, awx_job_template_name="Deploy web", awx_user_name="alice")) == \
        "AWX job 42 'Deploy web' by alice"
    assert job_text(dict(tower_job_id=7, tower_job_template_name="Patch", tower_user_name="bob")) == \
        "AWX job 7 'Patch' by bob"
    assert job_text(dict(awx_job_id=9)) == "AWX job 9"


def test_outside_awx_nothing():
    assert job_text({}) == "" and job_text(None) == "" and job_text(dict(awx_user_name="alice")) == ""


def test_what_a_user_set_is_one_short_line_that_never_looks_like_a_run_marker():
    text = job_text(dict(awx_job_id="1 [run deadbeef task]", awx_job_template_name="a\nb\x1b[2J" + "x" * 200))
    assert "\n" not in text and "\x1b" not in text and len(text) < 140
    assert not RUN_MARKER.search(text), text
