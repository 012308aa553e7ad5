"""Draw the Grafana dashboard's data, as a real Prometheus answers its queries, into a PNG (docs/dashboard.png).

Run by hand: ``.venv/bin/python tests/scripts/render_dashboard.py [docs/dashboard.png]`` (about 90 s;
needs ``prometheus`` and ``/usr/bin/chromium``).

This is not Grafana (which is not installed here): it is tests/test_prometheus.py's stack (two real
``jupyter server``s on the simulated driver, the culler on, a real Prometheus scraping them with the
documented jobs every second) with the notebooks opened one after another, a notebook that starts
four worker processes, then every panel's query (``jupyter-config/grafana/tfgpu-dashboard.json``,
with *All* selected) sent to Prometheus, and the answers drawn as the panels describe them (time
series over the run, tables at its end): an HTML page of SVG charts, shot with Chromium.
"""

from __future__ import annotations

import html
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from support.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from support.prometheus_stack import ROOT, Prometheus, Stack, as_grafana_sends, dashboard, panels  # noqa: E402

GIB = 1024**3
PALETTE = [
    "#73BF69",
    "#F2CC0C",
    "#8AB8FF",
    "#FF780A",
    "#F2495C",
    "#5794F2",
    "#B877D9",
    "#FADE2A",
    "#37872D",
    "#C4162A",
]
WIDTH, HEIGHT = 700, 250  # one chart's drawing area, in CSS pixels


def scenario(stack: Stack) -> tuple[float, float]:
    """Open the notebooks one after another, let one start workers; the run's start and end (Unix time)."""
    start = time.time()
    stack.open_notebook("plain", "explore.ipynb")
    time.sleep(15)
    stack.open_notebook("alice", "train.ipynb")
    time.sleep(15)
    stack.open_notebook("alice", "eval.ipynb")
    time.sleep(10)
    server, kernel_id = stack.kernels["train.ipynb"]
    # kernels_server: each process a kernel starts holds 256 MiB on the kernel's GPU.
    server.execute(
        kernel_id, "import subprocess\n_workers = [subprocess.Popen(['sleep', '600']) for _ in range(4)]"
    )
    time.sleep(20)
    end = time.time()
    server.execute(kernel_id, "for _w in _workers: _w.kill(); _w.wait()")  # our processes, by their handles
    return start, end


# -- formatting as Grafana does, roughly ----------------------------------------------------------
def fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        for size, name in ((GIB, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.0f} B"
    if unit == "s":
        for size, name in ((3600, "hour"), (60, "min")):
            if abs(value) >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.3g} s"
    return f"{value:.3g}"


def legend(fmt_string: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt_string)


def nice_step(top: float) -> float:
    raw = top / 4 or 1
    power = 10 ** math.floor(math.log10(raw))
    return next(s * power for s in (1, 2, 2.5, 5, 10) if s * power >= raw)


# -- panels ---------------------------------------------------------------------------------------
def timeseries(panel: dict[str, Any], prom: Prometheus, start: float, end: float) -> str:
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    stacked = panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    dashed = {
        o["matcher"]["options"]
        for o in panel["fieldConfig"]["overrides"]
        if o["matcher"]["id"] == "byFrameRefID"
    }
    series = []
    for target in panel["targets"]:
        for s in prom.query_range(as_grafana_sends(target["expr"]), start, end, 1):
            points = [(float(t), float(v)) for t, v in s["values"]]
            series.append((legend(target["legendFormat"], s["metric"]), points, target["refId"] in dashed))
    series.sort(key=lambda s: s[0])
    times = sorted({t for _, points, _ in series for t, _ in points})
    drawn = []  # (name, colour, dashed, [(t, low, high)])
    base = {t: 0.0 for t in times}
    for n, (name, points, dash) in enumerate(series):
        lows = [(t, base[t] if stacked else 0.0, (base[t] if stacked else 0.0) + v) for t, v in points]
        if stacked:
            for t, _, high in lows:
                base[t] = high
        drawn.append((name, PALETTE[n % len(PALETTE)], dash, lows, points[-1][1] if points else None))
    top = max([high for *_, pts, _ in drawn for _, _, high in pts] or [1])
    scale = GIB if unit == "bytes" and top >= GIB else 1  # ticks at round GiB, as Grafana's IEC units
    step = nice_step(top / scale) * scale
    top = math.ceil(top / step) * step
    left, bottom = 70, 22

    def x(t: float) -> float:
        return left + (t - start) / max(end - start, 1) * (WIDTH - left - 10)

    def y(v: float) -> float:
        return (HEIGHT - bottom) - v / top * (HEIGHT - bottom - 8)

    parts = [f'<svg width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">']
    tick = 0.0
    while tick <= top + 1e-9:
        parts.append(
            f'<line x1="{left}" x2="{WIDTH - 10}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" class="axis" text-anchor="end">{fmt(tick, unit)}</text>'
        )
        tick += step
    for k in range(0, 5):
        t = start + k * (end - start) / 4
        label = time.strftime("%H:%M:%S", time.localtime(t))
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        parts.append(
            f'<text x="{x(t):.1f}" y="{HEIGHT - 4}" class="axis" text-anchor="{anchor}">{label}</text>'
        )
    for _name, colour, dash, pts, _ in drawn:
        line = " ".join(f"{x(t):.1f},{y(high):.1f}" for t, _, high in pts)
        if stacked and pts:
            lower = " ".join(f"{x(t):.1f},{y(low):.1f}" for t, low, _ in reversed(pts))
            parts.append(
                f'<polygon points="{line} {lower}" fill="{colour}" fill-opacity="0.2" stroke="none"/>'
            )
        style = 'stroke-dasharray="8 6" stroke-width="1.5"' if dash else 'stroke-width="2"'
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" {style}/>')
    parts.append("</svg>")
    rows = "".join(
        f'<tr><td><span class="swatch" style="background:{c}"></span>{html.escape(name)}</td>'
        f'<td class="num">{fmt(last, unit) if last is not None else ""}</td></tr>'
        for name, c, _, _, last in drawn
    )
    return (
        "".join(parts) + f'<table class="legend"><tr><th></th><th class="num">Last *</th></tr>{rows}</table>'
    )


def table(panel: dict[str, Any], prom: Prometheus) -> str:
    """The panel's instant queries merged on their labels, then organised and sorted as its transformations say."""
    rows: dict[tuple, dict[str, Any]] = {}
    keys = ("instance", "kernel_id", "kernel_name", "path")
    for target in panel["targets"]:
        for s in prom.query(as_grafana_sends(target["expr"])):
            row = rows.setdefault(
                tuple(s["metric"].get(k, "") for k in keys),
                dict(zip(keys, (s["metric"].get(k, "") for k in keys), strict=False)),
            )
            row[f"Value #{target['refId']}"] = float(s["value"][1])
    transforms = {t["id"]: t["options"] for t in panel["transformations"]}
    if "filterByValue" in transforms:
        rows = {k: r for k, r in rows.items() if r.get("Value #A") is not None}
    organise = transforms["organize"]
    columns = sorted(organise["indexByName"], key=organise["indexByName"].get)
    rename = organise["renameByName"]
    units = {o["matcher"]["options"]: o["properties"][0]["value"] for o in panel["fieldConfig"]["overrides"]}
    [sort] = transforms["sortBy"]["sort"]
    by_name = {rename.get(c, c): c for c in columns}
    ordered = sorted(rows.values(), key=lambda r: r.get(by_name[sort["field"]]) or 0, reverse=sort["desc"])
    head = "".join(f"<th>{html.escape(rename.get(c, c))}</th>" for c in columns)
    body = ""
    for row in ordered:
        cells = []
        for c in columns:
            value = row.get(c)
            unit = units.get(rename.get(c, c))
            text = "" if value is None else fmt(value, unit) if unit else str(value)
            if c == "kernel_id":
                text = text[:8] + "…"
            cells.append(f'<td class="{"num" if unit else ""}">{html.escape(text)}</td>')
        body += f"<tr>{''.join(cells)}</tr>"
    if not ordered:
        body = f'<tr><td colspan="{len(columns)}">No data</td></tr>'
    return f'<table class="data"><tr>{head}</tr>{body}</table>'


STYLE = """
body { margin: 0; background: #111217; color: #ccccdc; font: 13px Inter, Helvetica, Arial, sans-serif; }
header { padding: 12px 16px; display: flex; gap: 24px; align-items: baseline; }
header h1 { font-size: 18px; font-weight: 500; margin: 0; color: #fff; }
.var { background: #181b1f; border: 1px solid #2c3235; padding: 3px 8px; border-radius: 2px; }
.note { color: #8e8e9e; margin-left: auto; }
main { display: grid; grid-template-columns: repeat(2, 724px); gap: 8px; padding: 0 16px 16px; }
section { background: #181b1f; border: 1px solid #2c3235; border-radius: 2px; padding: 8px 12px; }
h2 { font-size: 14px; font-weight: 500; margin: 0 0 6px; color: #fff; }
.grid { stroke: #2c3235; stroke-width: 1; }
.axis { fill: #8e8e9e; font-size: 11px; }
table { border-collapse: collapse; width: 100%; }
.legend td, .legend th { padding: 1px 6px; font-size: 12px; }
.legend th { color: #6e9fff; font-weight: 500; }
.data th { text-align: left; color: #6e9fff; font-weight: 500; border-bottom: 1px solid #2c3235; padding: 6px; }
.data td { padding: 6px; border-bottom: 1px solid #22252b; }
.num { text-align: right; }
.swatch { display: inline-block; width: 14px; height: 4px; margin-right: 6px; vertical-align: middle; border-radius: 2px; }
"""


def page(prom: Prometheus, start: float, end: float) -> str:
    board = dashboard()
    order = sorted(panels(board), key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    sections = []
    for panel in order:
        inner = timeseries(panel, prom, start, end) if panel["type"] == "timeseries" else table(panel, prom)
        sections.append(f"<section><h2>{html.escape(panel['title'])}</h2>{inner}</section>")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(end))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{STYLE}</style></head><body>"
        f"<header><h1>{html.escape(board['title'])}</h1><span class='var'>Prometheus: prometheus</span>"
        f"<span class='var'>Jupyter server: All</span>"
        f"<span class='note'>the dashboard's queries against a real Prometheus, simulated GPUs, {when}; "
        f"drawn by tests/scripts/render_dashboard.py, not Grafana</span></header>"
        f"<main>{''.join(sections)}</main></body></html>"
    )


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png").resolve()
    home = Path(tempfile.mkdtemp(prefix="tfgpu-render-dashboard-"))
    stack = Stack(home, culler=True)
    try:
        stack.start()
        start, end = scenario(stack)
        assert stack.prometheus is not None
        document = page(stack.prometheus, start, end)
    finally:
        stack.stop()
    (home / "dashboard.html").write_text(document)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            view = browser.new_page(viewport={"width": 1490, "height": 900})
            view.goto((home / "dashboard.html").as_uri())
            view.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()
    shutil.rmtree(home, ignore_errors=True)
    print(out)


if __name__ == "__main__":
    main()
