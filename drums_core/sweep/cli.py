"""``python -m drums_core.sweep --ledger DIR [--run RUN] [--json] [--dry-run] [--force]``: the sweep
(:func:`drums_core.sweep.driver.sweep`) from the command line. Exit 0 done, 1 errors, 2 bad
arguments, 3 survivors."""
from __future__ import annotations

import argparse
import logging
import sys

from ..errors import DrumsError
from .driver import sweep
from .hostops import KILL_TIMEOUT
from .report import RunStatus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m drums_core.sweep",
                                 description="Delete what dead Drums runs' ledgers own (and nothing else).")
    ap.add_argument("--ledger", required=True, help="ledger root, e.g. /run/drums/default/ledger")
    ap.add_argument("--run", help="sweep only this run")
    ap.add_argument("--force", action="store_true", help="with --run: sweep it even if its owner is alive")
    ap.add_argument("--dry-run", action="store_true", help="change nothing; report what would be done")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    ap.add_argument("--kill-timeout", type=float, default=KILL_TIMEOUT, help="seconds to wait for killed processes")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.force and not args.run:
        ap.error("--force needs --run")
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    try:
        report = sweep(args.ledger, run=args.run, dry_run=args.dry_run, only_dead=not args.force,
                       kill_timeout=args.kill_timeout)
    except DrumsError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(indent=2))
    elif not any(r.status != RunStatus.SKIPPED_ALIVE for r in report.runs):
        print(f"sweep: nothing to do under {args.ledger}", file=sys.stderr)
    if report.errors:
        return 1
    return 3 if report.survivors else 0


if __name__ == "__main__":
    sys.exit(main())
