"""The snapshot bridge between OSWorld's ``DesktopEnv`` and Drums checkpoints.

* Reuse modes (:mod:`.reuse`): ``none`` (every rollout reverts to ``init_state`` and runs the
  task's setup) and ``post_setup`` (the first rollout of a task saves ``post_setup:<task id>``;
  later ones restore it and skip the setup). The agent code is the same under both: it calls
  ``env.reset(task_config=...)`` as in OSWorld; the mode is a property of the env's provider.
* Mid-task branches (:mod:`.branch`): N sibling ``DesktopEnv``s at once from a state saved
  mid-task, each with its own desktop, continuing independently and evaluated by the task's own
  evaluator.

A rollout never starts on a used desktop: a reset skips its revert only when the provider knows
the desktop is an untouched restore of the snapshot the rollout needs.
"""
from __future__ import annotations

from .branch import branch, close_all, saved_state
from .reuse import ReuseMode, delete_post_setup, post_setup_name, post_setup_scope, set_reuse_mode

__all__ = ["ReuseMode", "branch", "close_all", "delete_post_setup", "post_setup_name", "post_setup_scope",
           "saved_state", "set_reuse_mode"]
