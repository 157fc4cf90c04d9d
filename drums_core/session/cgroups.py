"""Per-session resource limits through cgroups: these modules own every cgroup Drums makes.

A session's group is named ``drums/<run>/<session>`` (:func:`group_name`) and lives under each
controller hierarchy it uses:

- cgroup v1 (:class:`CgroupV1Driver`): one directory per hierarchy, for the ``memory``, ``pids``,
  ``cpu`` (alone or co-mounted with ``cpuacct``) and, when mounted, ``freezer`` controllers,
  e.g. ``/sys/fs/cgroup/memory/drums/<run>/<session>``;
- cgroup v2 (:class:`CgroupV2Driver`): one directory under the unified mount, with ``memory``,
  ``pids`` and ``cpu`` enabled in every ancestor's ``cgroup.subtree_control``.

:func:`detect` chooses at start-up (v1 when its memory, pids and cpu hierarchies are mounted, else
v2 when usable, else :class:`~drums_core.errors.FailedPrecondition` naming what is missing).

Plan, then apply, as the ledger needs (write-ahead)::

    cg = driver.plan(run, sid)                         # no side effect: names and paths only
    ledger.record("cgroup", cg.name, **cg.ledger_data())
    driver.create(run, sid, Limits(memory_max=...))    # idempotent
    ...start the session with preexec_fn=lambda: enter(cg.paths), or cg.attach(pid)...
    cg.remove()                                        # kill every member, rmdir; then
    ledger.forget("cgroup", cg.name)

The sweep (:mod:`drums_core.sweep.step_mounts`) reaps groups of dead runs with :func:`members`,
:func:`kill_members`, :func:`remove_dirs` and :func:`check_group_dir`; leak checks use
:func:`list_run_groups`. Nothing here follows a symlink or touches a directory outside
``<hierarchy>/drums/``.

The parts: :mod:`.cgroup_fs` (names, hierarchies, files, members), :mod:`.cgroup_kill` (emptying and
removing groups), :mod:`.cgroup_session` (:class:`SessionCgroup`), :mod:`.cgroup_drivers` (making
groups and applying :class:`Limits`; :func:`detect`). This module gathers their public names.
"""
from __future__ import annotations

from .cgroup_drivers import (DEVICE_ALLOW, CgroupDriver, CgroupV1Driver, CgroupV2Driver, GiB, Limits, MiB,
                             detect)
from .cgroup_fs import (BASE, MAX_WALK, PROCS, REQUIRED, V1_CONTROLLERS, V1_ROLES, Hierarchy, cgroup_mountpoints,
                        check_group_dir, enter, group_name, hierarchies, list_run_groups, members, parse_group_name,
                        parse_keyed, read_procs)
from .cgroup_kill import KillResult, kill_members, remove_dirs, remove_run_dir
from .cgroup_session import SessionCgroup

__all__ = ["BASE", "DEVICE_ALLOW", "GiB", "MAX_WALK", "MiB", "PROCS", "REQUIRED", "V1_CONTROLLERS", "V1_ROLES",
           "CgroupDriver", "CgroupV1Driver", "CgroupV2Driver", "Hierarchy", "KillResult", "Limits", "SessionCgroup",
           "cgroup_mountpoints", "check_group_dir", "detect", "enter", "group_name", "hierarchies", "kill_members",
           "list_run_groups", "members", "parse_group_name", "parse_keyed", "read_procs", "remove_dirs",
           "remove_run_dir"]
