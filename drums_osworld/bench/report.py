"""A suite's result as JSON, a markdown table and a PNG plot of its distributions.

A result is a dict with at least ``suite``, ``quick``, ``host``, ``params``, ``table`` (rows for the
markdown table: a list of flat dicts), ``plot`` (``{"title", "ylabel", "series": {name: [values]}}``,
drawn as box plots with every sample on top; ``"kind": "line"`` with ``"x"`` draws lines instead)
and ``summary`` (the headline figures). :func:`write` puts ``<suite>.json``, ``<suite>.md`` and
``<suite>.png`` under the output directory and returns their paths.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from drums_core.records import json_default


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_cell(x) for x in v)
    return str(v).replace("|", "\\|")


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    out = [f"# drums bench {result['suite']}{' (quick)' if result.get('quick') else ''}", ""]
    host = result.get("host") or {}
    if host:
        out.append(f"Host: kernel {host.get('kernel')}, {host.get('cpus')} CPUs, {host.get('criu')}, "
                   f"load {host.get('loadavg')}, other drums daemons running: "
                   f"{', '.join(host.get('other_drums_daemons') or []) or 'none'}; {host.get('time')}.")
        out.append("")
    out.append(markdown_table(result.get("table") or []))
    summ = result.get("summary") or {}
    if summ:
        out.append("Summary:")
        out.append("")
        for k, v in summ.items():
            out.append(f"- {k}: {_cell(v) if not isinstance(v, dict) else json.dumps(v)}")
        out.append("")
    for note in result.get("notes") or []:
        out.append(f"> {note}")
    return "\n".join(out).rstrip() + "\n"


def plot(result: dict, path: Path) -> Path | None:
    spec = result.get("plot")
    if not spec or not spec.get("series"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if spec.get("kind") == "stacked":
        return _stacked(result, spec, path, plt)
    series = {k: [float(x) for x in v if x is not None] for k, v in spec["series"].items()}
    width = 9.0 if spec.get("kind") == "line" else max(6.0, 1.3 * len(series) + 3)
    fig, ax = plt.subplots(figsize=(width, 4.5), dpi=110)
    if spec.get("kind") == "line":
        for name, ys in series.items():
            xs = spec.get("x", {}).get(name) or list(range(1, len(ys) + 1))
            ax.plot(xs, ys, marker="o", ms=3, lw=1, label=name)
        ax.set_xlabel(spec.get("xlabel", ""))
        ax.legend(fontsize=8)
    else:
        names = list(series)
        data = [series[n] or [float("nan")] for n in names]
        ax.boxplot(data, whis=(5, 95), showfliers=False)
        for i, ys in enumerate(data, start=1):
            jitter = [i + 0.18 * ((j * 0.618) % 1 - 0.5) for j in range(len(ys))]
            ax.scatter(jitter, ys, s=9, alpha=0.6, zorder=3)
        ax.set_xticks(range(1, len(names) + 1))
        ax.set_xticklabels(names, rotation=15, ha="right", fontsize=8)
        if spec.get("log"):
            from matplotlib.ticker import ScalarFormatter

            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_ylabel(spec.get("ylabel", ""))
    ax.set_title(spec.get("title", result["suite"]), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _stacked(result: dict, spec: dict, path: Path, plt) -> Path:
    """Horizontal stacked bars: one bar per series, one segment per class (``spec["classes"]``)."""
    names = list(spec["series"])
    classes = spec.get("classes") or sorted({c for v in spec["series"].values() for c in v})
    fig, ax = plt.subplots(figsize=(10.0, max(3.0, 0.32 * len(names) + 1.5)), dpi=110)
    left = [0.0] * len(names)
    for cls in classes:
        vals = [float(spec["series"][n].get(cls, 0)) for n in names]
        ax.barh(names, vals, left=left, label=cls)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel(spec.get("ylabel", ""))
    ax.set_title(spec.get("title", result["suite"]), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write(result: dict, out_dir: Path) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = result["suite"] + ("-quick" if result.get("quick") else "")
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    try:
        png = plot(result, paths["png"])
    except ImportError as exc:  # matplotlib is in the dev extra; the figures stand without the picture
        png = None
        result.setdefault("notes", []).append(f"no plot: {exc}")
    if png is None:
        paths.pop("png")
    result["files"] = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(json.dumps(result, indent=1, default=json_default) + "\n")
    paths["markdown"].write_text(markdown(result))
    return result["files"]
