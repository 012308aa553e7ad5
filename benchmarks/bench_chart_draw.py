"""Time to draw one update of the panel in Chromium: 8 GPUs, 1000 points per series (by hand).

    python benchmarks/bench_chart_draw.py [--gpus 8] [--points 1000] [--updates 300]

Serves the repository on loopback, opens benchmarks/chart_draw.html in headless Chromium; the
page builds the real panel from the built bundle (tfgpu_magic/static/widget.js, `npm run
build` first) with a fake model, then times `receive(one new point)` + `draw()` with
performance.now().  uPlot draws inside `batch()`, synchronously, so the canvas work is
included.  Saves a screenshot to test-artifacts/bench-chart-draw.png.  No assertions.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import pathlib
import threading

REPO = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=300)
    args = parser.parse_args()
    if not (REPO / "tfgpu_magic" / "static" / "widget.js").is_file():
        raise SystemExit("build the front end first: npm install && npm run build")

    from playwright.sync_api import sync_playwright

    handler = functools.partial(Quiet, directory=str(REPO))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = (
        f"http://127.0.0.1:{server.server_port}/benchmarks/chart_draw.html"
        f"?gpus={args.gpus}&points={args.points}&updates={args.updates}"
    )
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1220, "height": 1000})
            page.goto(url)
            page.wait_for_function("() => window.result", timeout=120_000)
            result = page.evaluate("() => window.result")
            (REPO / "test-artifacts").mkdir(exist_ok=True)
            page.screenshot(path=str(REPO / "test-artifacts" / "bench-chart-draw.png"), full_page=True)
            version = browser.version
            browser.close()
    finally:
        server.shutdown()
    print(f"Chromium {version}, headless, --disable-gpu")
    print(
        f"{result['gpus']} GPUs x 7 series x {result['points']} points, "
        f"{result['charts']} charts, {result['updates']} updates:"
    )
    print(
        f"  one update (receive + trim + draw all charts): median {result['median_ms']:.2f} ms, "
        f"p95 {result['p95_ms']:.2f} ms, max {result['max_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
