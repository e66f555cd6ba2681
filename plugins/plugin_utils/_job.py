# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the AWX / Ansible Automation Platform job a run belongs to, for display.

AWX and AAP's automation controller pass every job extra variables naming it (awx_job_id, awx_job_template_name,
awx_user_name, and the same as tower_*; AAP 2 still sets both). Lock labels name the job with them, so
`hostlock status`, lock_info and every waiting line say which job holds a host, not only "pid 7 in a
container". They are variables a user can set: shown, never trusted. Nothing decides on them (same-run and
in-flight judgements rest on uids and secrets, docs/security.md), and the text can hold no `[`/`]`, so it
can never pass for the "[run ID]" marker the plugins append to a label.
"""

from __future__ import annotations

import typing as t

from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.text import one_line

FIELD_MAX = 48  # each name shown, at most; the label as a whole stays short


def _pick(variables: t.Mapping[str, t.Any], *names: str) -> str:
    for name in names:
        value = variables.get(name)
        if value is not None and str(value).strip():
            text = one_line(str(value).strip()).replace("[", "(").replace("]", ")")
            return text if len(text) <= FIELD_MAX else text[: FIELD_MAX - 3] + "..."
    return ""


def job_text(variables: t.Mapping[str, t.Any] | None) -> str:
    """"AWX job 42 'Deploy web' by alice" (as much as the variables say), or "" outside AWX/AAP."""
    variables = variables or {}
    job = _pick(variables, "awx_job_id", "tower_job_id")
    if not job:
        return ""
    template = _pick(variables, "awx_job_template_name", "tower_job_template_name")
    workflow = _pick(variables, "awx_workflow_job_name", "tower_workflow_job_name")
    user = _pick(variables, "awx_user_name", "tower_user_name")
    text = f"AWX job {job}"
    if template:
        text += f" {template!r}"
    if workflow:
        text += f" in workflow {workflow!r}"
    if user:
        text += f" by {user}"
    return text
