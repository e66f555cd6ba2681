# Test-only callback: writes every task result to $HOSTLOCK_TEST_RECORD as JSON, next to the normal
# output (ansible-core ships no JSON stdout callback; ansible.posix.json is not installed here).
from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: record
type: aggregate
short_description: Record task results as JSON for the hostlock integration tests
description: Writes task results (task name, host, result) to the file named by HOSTLOCK_TEST_RECORD.
"""


def _plain(value):
    for attr in ("as_simple_dict", "_as_simple_dict"):
        if hasattr(value, attr):
            return getattr(value, attr)()
    if hasattr(value, "__dict__"):
        return {k: str(v) for k, v in vars(value).items()}
    return str(value)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "record"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = {}

    def _store(self, result, status):
        data = dict(result.result)
        data["_status"] = status
        data["_warnings"] = [getattr(w, "msg", None) or str(w) for w in getattr(result, "warnings", ()) or ()]
        self.results.setdefault(result.task.get_name(), {})[result.host.get_name()] = data
        self._flush()

    def _flush(self):
        path = os.environ.get("HOSTLOCK_TEST_RECORD")
        if path:
            with open(path + ".tmp", "w") as f:
                json.dump(self.results, f, default=_plain)
            os.replace(path + ".tmp", path)

    def v2_runner_on_ok(self, result):
        self._store(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._store(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._store(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._store(result, "unreachable")
