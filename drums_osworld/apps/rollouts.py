"""Branched-rollout evaluation: N sibling desktops of one saved state, one action script each, scored.

    drums rollouts --task T --from-state NAME --branches N --actions FILE [--json] --out DIR

restores N siblings of the snapshot NAME at once (a state saved with
``env.unwrapped.save_state(NAME, keep=True)``, ``drums checkpoint --name NAME``, ...), runs each
branch's action script on its own desktop (all branches at the same time, each action as
``DesktopEnv.step`` runs it), scores each with the task's evaluator, writes one JSON line per
branch to ``DIR/rollouts.jsonl`` (actions, score, timings, screenshot paths) with the
screenshots under ``DIR/branch-XX/``, and prints a summary table (``--json``: the JSON lines).
The same from Python: :func:`run_rollouts`.

The action file is JSON: a list with one entry per branch, each a list of actions or
``{"name": ..., "actions": [...]}`` (or ``{"branches": [that list]}``). An action is pyautogui code
or ``WAIT``/``DONE``/``FAIL``. One script for N branches runs it on every branch. A script that
stops before ``DONE``/``FAIL`` is scored where it stops; one that ends early skips the rest.

The snapshot is not deleted (it is the caller's); every sibling is destroyed before returning.
A state whose task setup failed (the guest's setup log, :mod:`drums_osworld.setup_journal`) gives
invalid branches: ``invalid`` names the failed step and its error, no action runs and no score is
given (never a 0). The exit status is 0 when every branch ran and was scored, 1 otherwise (an
invalid branch included), 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drums_core.errors import DrumsError

from ..gym.env import DrumsDesktopEnv
from ..progress import progress as progress_bar

log = logging.getLogger("drums.osworld.rollouts")

__all__ = ["BranchResult", "Rollouts", "Script", "load_scripts", "main", "run_rollouts"]


@dataclass
class Script:
    """One branch's actions."""

    name: str
    actions: list[Any]


@dataclass
class BranchResult:
    """One line of ``rollouts.jsonl``."""

    branch: int
    name: str
    task: str
    state: str
    session: str | None
    actions: list[Any]
    actions_run: int = 0
    score: float | None = None
    terminated: bool = False
    error: str | None = None
    invalid: str | None = None
    setup: dict[str, Any] | None = None
    liveness: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    screenshots: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Rollouts:
    """What :func:`run_rollouts` did: one :class:`BranchResult` per branch, in branch order."""

    task: str
    state: str
    snapshot: str | None
    out_dir: Path
    branches: list[BranchResult]
    timings: dict[str, float]

    @property
    def scores(self) -> list[float | None]:
        return [b.score for b in self.branches]

    @property
    def ok(self) -> bool:
        return all(b.error is None and b.score is not None for b in self.branches)

    def table(self) -> str:
        """The summary table people read."""
        rows = [{"branch": b.branch, "name": b.name, "score": "-" if b.score is None else f"{b.score:g}",
                 "steps": f"{b.actions_run}/{len(b.actions)}",
                 "actions_s": f"{b.timings.get('actions', 0.0):.2f}", "eval_s": f"{b.timings.get('evaluate', 0.0):.2f}",
                 "status": ("error: " + (b.error or "")[:60] if b.error else
                            "invalid: " + (b.invalid or "")[:60] if b.invalid else (b.liveness or "ok"))}
                for b in self.branches]
        cols = ["branch", "name", "score", "steps", "actions_s", "eval_s", "status"]
        widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
        lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
        lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
        scored = [s for s in self.scores if s is not None]
        mean = f"{sum(scored) / len(scored):.2f}" if scored else "-"
        lines.append(f"{len(self.branches)} branches of state {self.state} (task {self.task}): restored at once in "
                     f"{self.timings.get('restore', 0.0):.2f} s; mean score {mean}; "
                     f"{sum(1 for s in scored if s == 1.0)}/{len(self.branches)} scored 1; "
                     f"{sum(1 for b in self.branches if b.invalid)} invalid (setup failed); "
                     f"total {self.timings.get('total', 0.0):.1f} s")
        return "\n".join(lines)


def load_scripts(source: str | Path | list[Any] | dict[str, Any], branches: int | None = None) -> list[Script]:
    """The branches' scripts from an action file (or its parsed JSON), one per branch.

    With ``branches`` given, a single script is repeated that many times; any other count must
    match. Raises ``ValueError`` naming the problem.
    """
    if isinstance(source, (str, Path)):
        try:
            data: Any = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"cannot read the action file {source}: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"the action file {source} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    else:
        data = source
    if isinstance(data, dict) and "branches" in data:
        data = data["branches"]
    if not isinstance(data, list) or not data:
        raise ValueError("the action file must hold a non-empty list of branch scripts")
    scripts: list[Script] = []
    for i, item in enumerate(data):
        if isinstance(item, dict):
            name, actions = str(item.get("name") or f"branch-{i}"), item.get("actions")
        else:
            name, actions = f"branch-{i}", item
        if not isinstance(actions, list) or not actions:
            raise ValueError(f"script {i} ({name}): 'actions' must be a non-empty list")
        for j, action in enumerate(actions):
            if not isinstance(action, (str, dict)):
                raise ValueError(f"script {i} ({name}) action {j}: pyautogui code, WAIT, DONE or FAIL, "
                                 f"not {type(action).__name__}")
        scripts.append(Script(name, list(actions)))
    if branches is not None:
        if branches < 1:
            raise ValueError("--branches must be at least 1")
        if len(scripts) == 1 and branches > 1:
            scripts = [Script(f"{scripts[0].name}-{k}", list(scripts[0].actions)) for k in range(branches)]
        elif len(scripts) != branches:
            raise ValueError(f"the action file has {len(scripts)} scripts for {branches} branches "
                             "(give one per branch, or one for all)")
    return scripts


def _short(action: Any, width: int = 70) -> str:
    text = action if isinstance(action, str) else json.dumps(action)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def run_rollouts(task: Any, state: str, scripts: list[Script] | list[list[Any]] | str | Path, *,
                 out_dir: str | Path, branches: int | None = None, client: Any = None,
                 pause: float = 0.5, progress: bool = True, step_screenshots: bool = True,
                 wait_live: bool = False, **env_kwargs: Any) -> Rollouts:
    """Restore ``len(scripts)`` siblings of ``state``, run one script on each, score them.

    ``task`` is a task path, dict or :class:`~drums_osworld.tasks.Task` (or a task name found
    under ``tasks/``); ``state`` a snapshot name or id. ``scripts`` are :class:`Script`, lists of
    actions, or an action file. Writes ``out_dir/rollouts.jsonl``, ``out_dir/summary.json`` and
    the screenshots (``branch-XX/start.png``, ``step-YY.png``, ``final.png``: the screen after the
    last action, before scoring). Branch failures are recorded, not raised; a failed restore raises.
    """
    t_start = time.monotonic()
    if isinstance(scripts, (str, Path)):
        scripts = load_scripts(scripts, branches)
    else:
        scripts = load_scripts([asdict(s) if isinstance(s, Script) else s for s in scripts], branches)
    task = _resolve_task(task)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = len(scripts)
    total = sum(len(s.actions) for s in scripts) + n
    bar = progress_bar(total, f"{n} branches", quiet=not progress, leave=False)
    bar_lock = threading.Lock()

    def tick(k: int = 1) -> None:
        with bar_lock:
            bar.update(k)

    envs: list[DrumsDesktopEnv] = []
    try:
        t = time.monotonic()
        envs = DrumsDesktopEnv.branch_from(state, n, task=task, client=client, pause=pause, max_steps=None,
                                           wait_live=wait_live, **env_kwargs)
        restore_s = time.monotonic() - t
        snapshot = (envs[0].restore_info or {}).get("snapshot") if envs else None
        bar.set_postfix_str(f"restored in {restore_s:.2f} s")

        def run(i: int) -> BranchResult:
            return _run_branch(i, envs[i], scripts[i], task, state, out, restore_s, step_screenshots, tick)

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="rollout") as pool:
            results = list(pool.map(run, range(n)))
    finally:
        bar.close()
        for env in envs:
            env.close()
    report = Rollouts(task=task.id, state=state, snapshot=snapshot, out_dir=out, branches=results,
                      timings={"restore": restore_s, "total": time.monotonic() - t_start})
    with open(out / "rollouts.jsonl", "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r.to_json()) + "\n")
    (out / "summary.json").write_text(json.dumps(
        {"task": report.task, "state": state, "snapshot": snapshot, "branches": n, "scores": report.scores,
         "timings": report.timings, "jsonl": str(out / "rollouts.jsonl")}, indent=1))
    return report


def _run_branch(i: int, env: DrumsDesktopEnv, script: Script, task: Any, state: str, out: Path,
                restore_s: float, step_screenshots: bool, tick: Any) -> BranchResult:
    r = BranchResult(branch=i, name=script.name, task=task.id, state=state, session=env.session_id,
                     actions=script.actions)
    shots = out / f"branch-{i:02d}"
    shots.mkdir(parents=True, exist_ok=True)
    r.timings["restore"] = restore_s
    ready = ((env.restore_info or {}).get("session_timings") or {}).get("ready")
    if isinstance(ready, (int, float)):
        r.timings["ready"] = float(ready)   # this sibling's own restore, daemon side
    t_branch = time.monotonic()
    done = 0
    report = env.setup_report  # how the setup of the state these siblings come from went
    if report is not None:
        r.setup = report.to_json()
        if not report.ok:  # an invalid attempt: not run, never scored
            r.invalid = report.describe()
            log.warning("branch %d (%s) is invalid: %s", i, script.name, r.invalid)
            tick(len(script.actions) + 1)
            r.timings["total"] = time.monotonic() - t_branch
            return r
    try:
        env.observe()
        r.screenshots["start"] = _write_png(shots / "start.png", env.last_screenshot_png)
        r.screenshots["steps"] = []
        t = time.monotonic()
        evaluate_s = 0.0
        for j, action in enumerate(script.actions):
            _, reward, terminated, truncated, info = env.step(action)
            done += 1
            tick()
            seconds = info.get("seconds", {})
            evaluate_s += seconds.get("evaluate", 0.0)
            ex = info.get("exec") or {}
            r.steps.append({"action": action, "seconds": round(sum(seconds.values()), 4),
                            "returncode": ex.get("returncode"), "error": (ex.get("error") or "")[-500:] or None})
            if step_screenshots:
                r.screenshots["steps"].append(_write_png(shots / f"step-{j + 1:02d}.png", env.last_screenshot_png))
            if terminated or truncated:
                r.terminated = True
                r.score = float(info.get("score", reward))
                break
        r.actions_run = done
        r.screenshots["final"] = _write_png(shots / "final.png", env.last_screenshot_png)
        if r.score is None:
            te = time.monotonic()
            r.score = env.evaluate()
            evaluate_s += time.monotonic() - te
        r.timings["actions"] = time.monotonic() - t - evaluate_s
        r.timings["evaluate"] = evaluate_s
    except Exception as exc:  # noqa: BLE001 - one branch's failure is its result, not the run's
        log.warning("branch %d (%s) failed: %s", i, script.name, exc, exc_info=True)
        r.actions_run = done
        r.error = f"{type(exc).__name__}: {exc}"
    finally:
        tick(len(script.actions) + 1 - done)
    # A score from a desktop whose restored programs died is not a result: wait for the verdict.
    try:
        r.liveness = str(env.client.wait_live(r.session, timeout=60.0).get("liveness")) if r.session else None
    except DrumsError as exc:
        r.liveness = "failed"
        r.error = r.error or f"the restored desktop failed its liveness check: {exc}"
    r.timings["total"] = time.monotonic() - t_branch
    return r


def _write_png(path: Path, data: bytes | None) -> str | None:
    if data is None:
        return None
    path.write_bytes(data)
    return str(path)


def _resolve_task(task: Any) -> Any:
    from ..tasks import find_task, load_task

    if isinstance(task, str) and not Path(task).exists():
        task = find_task(task)
    return load_task(task, require_drums_support=True)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``drums rollouts`` (usage errors: one line, exit status 2)."""
    from drums_core.cli import UsageParser

    parser = UsageParser(prog="drums rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, help="task file, or a task name/id under tasks/")
    parser.add_argument("--from-state", required=True, metavar="NAME", help="snapshot name or id to branch from")
    parser.add_argument("--branches", type=int, default=None, help="number of siblings (default: one per script)")
    parser.add_argument("--actions", required=True, metavar="FILE", help="JSON action scripts, one per branch")
    parser.add_argument("--out", required=True, metavar="DIR", help="where rollouts.jsonl and the screenshots go")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds after each action (default 0.5)")
    parser.add_argument("--instance", default=None, help="Drums instance (default: $DRUMS_INSTANCE or default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the JSON lines instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``drums rollouts``: see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        scripts = load_scripts(args.actions, args.branches)
        task = _resolve_task(args.task)
    except ValueError as exc:  # TaskError is a ValueError
        print(f"drums rollouts: {exc}", file=sys.stderr)
        return 2
    from drums_core.client import Client
    from drums_core.config import Instance, check_name, instance_from_env

    Path(args.out).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, filename=str(Path(args.out) / "rollouts.log"),
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    try:
        client = Client(Instance(name=check_name(args.instance, "instance")) if args.instance else instance_from_env())
        report = run_rollouts(task, args.from_state, scripts, out_dir=args.out, client=client, pause=args.pause,
                              progress=not args.no_progress)
    except DrumsError as exc:
        if args.json:
            print(json.dumps({"error": exc.to_wire()}))
        else:
            print(f"drums rollouts: {exc.code}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        for b in report.branches:
            print(json.dumps(b.to_json()))
    else:
        print(report.table())
        print(f"wrote {report.out_dir / 'rollouts.jsonl'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
