# Test-only stdout callback: prints one JSON document (every task result) at the end of the playbook and
# nothing else, so any other text on standard output makes it unparsable (ansible-core ships none).
from __future__ import annotations

import json

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: jsonout
type: stdout
short_description: One JSON document on standard output, for the hostlock integration tests
description: Collects task results and prints them as one JSON document when the playbook ends.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "jsonout"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = []

    def _store(self, result, status):
        self.results.append(dict(task=result.task.get_name(), host=result.host.get_name(), status=status))

    def v2_runner_on_ok(self, result):
        self._store(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._store(result, "failed")

    def v2_playbook_on_stats(self, stats):
        self._display.display(json.dumps(dict(results=self.results)))
