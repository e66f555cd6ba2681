"""The one holder text (core/holder.describe_holder) in its three uses: engine errors, a task's msg, gc --fleet."""

from hostlock.core.holder import describe_holder

FLEET = dict(record_ok=True, pid=12, user="root", cmdline="backup.sh", hostname="web1", fence=None, label="L")


def test_fleet_form_names_the_host_and_the_fence():
    assert describe_holder(FLEET) == "pid 12 (user root, backup.sh, label L)"
    assert describe_holder(FLEET, fleet=True) == "pid 12 on web1 (user root, backup.sh, label L)"
    fenced = dict(FLEET, fence=42)
    assert describe_holder(fenced) == "pid 12 on web1 (user root, backup.sh, label L)"
    assert describe_holder(fenced, fleet=True) == "pid 12 on web1 (user root, backup.sh, label L), fence 42"
    etcdctl = dict(record_ok=False, lease_id="694d", fence=7)
    assert describe_holder(etcdctl, fleet=True) == "etcdctl lock, lease 694d (no owner record), fence 7"


def test_detailed_form_is_a_task_msg():
    text = describe_holder(dict(FLEET, mode="shared", slot=None, stale=True), detailed=True)
    assert text == "pid 12, user root, 'backup.sh', label \"L\", shared, STALE on web1"
