"""A job never outlives its lock: the processes that run work under a lock, and what ties them to it.

Used by `hostlock run`/`cron`/`flock` (cli/supervise.py), the `locked` module's runner (module_utils/_runner.py),
leases (lease.py), the serialize wait (modules/serialize_host.py) and the controller's heartbeat
(plugin_utils/_heartbeat.py); imports only `core`.
- `deathsig.py`: prctl(2), a child that dies with its parent (PR_SET_PDEATHSIG), a subreaper;
- `forward.py`: signals meant for the job blocked, collected with sigtimedwait() and passed on to it
  (core.signals.FORWARDED), and the wait for the job's end: one mechanism for the command and the runner;
- `job.py`: the job's process: forked, held at a gate until its lock is held, exec'd;
- `watcher.py`: the process that keeps the lock until the job's whole tree is gone when its supervisor dies;
- `jobkill.py`: freezing and killing a job's tree (the watcher's, and a stopped job's stragglers);
- `daemon.py`: a detached process (double fork, a pid pipe) and closing every descriptor but some;
- `marks.py`: processes carrying a mark in their environment (`/proc/*/environ`): a job's tag, a lease's
  in-flight work, an earlier serialized run's tasks (the serialize callback's wait, modules/serialize_host.py).
"""
