"""Helpers for the gym tests: drive an env with a script, thread several, check what is left."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from drums_osworld.tasks import SPECIAL_ACTIONS


@dataclass
class Run:
    """What a script did in an env: the episode's reward, the rewards on the way, failed actions."""

    reward: float
    rewards: list[float] = field(default_factory=list)
    failed: list[tuple[int, Any, dict]] = field(default_factory=list)
    terminated: bool = False


def run_script(env: Any, actions: list[Any], *, finish: bool = True) -> Run:
    """Step ``actions``; unless one ended the episode, end it with DONE (``finish``). The reward."""
    run = Run(reward=0.0)
    for i, action in enumerate(actions):
        _, reward, terminated, truncated, info = env.step(action)
        run.rewards.append(reward)
        ex = info.get("exec")
        if action not in SPECIAL_ACTIONS and ex is not None and ex.get("returncode") != 0:
            run.failed.append((i, action, ex))
        if terminated or truncated:
            run.reward, run.terminated = reward, True
            return run
    if finish:
        _, reward, terminated, _, _ = env.step("DONE")
        run.rewards.append(reward)
        run.reward, run.terminated = reward, terminated
    return run


def run_parallel(jobs: list[tuple[Any, list[Any]]]) -> list[Run]:
    """``run_script`` on several envs at once (each env in its own thread)."""
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        return list(pool.map(lambda job: run_script(*job), jobs))


def snapshot_ids(client: Any) -> set[str]:
    return {s["id"] for s in client.snapshots()}
