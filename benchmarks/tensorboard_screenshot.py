"""Screenshot of the per-worker view in TensorBoard (not a test): a short 4-rank run with one slow
rank, TensorBoard on its event files, and headless Chromium on the Custom Scalars tab.

    python benchmarks/tensorboard_screenshot.py --out docs/tensorboard_workers.png

Needs Chromium (``apt-get install chromium``); takes about a minute. The run: rank 3 3x slower,
every rank pausing 0.3 s at 0.5% of its steps (so the stall charts have something to show).
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/tensorboard_workers.png")
    ap.add_argument("--frames", type=int, default=5120, help="frames of the run (4 ranks x 2 envs x 16 steps each update)")
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("error: no Chromium found: install it (apt-get install chromium), then run this again",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tb_shot_") as tmp:
        run = Path(tmp) / "run"
        subprocess.run([str(VENV_BIN / "mpiexec"), "-n", "4", sys.executable, "run_ddppo.py",
                        "--config", "configs/quick_pointnav.yaml", f"run.dir={run}",
                        f"run.total_frames={args.frames}", "heterogeneity.slow_ranks=[3]",
                        "heterogeneity.slowdown=3", "heterogeneity.stall_prob=0.005",
                        "heterogeneity.stall_s=0.3"], cwd=REPO, check=True, timeout=600)
        port = free_port()
        tb = subprocess.Popen([str(VENV_BIN / "tensorboard"), "--logdir", str(run / "tb"),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(120):  # TensorBoard takes a few seconds to serve
                try:
                    urllib.request.urlopen(url, timeout=1)
                    break
                except OSError:
                    time.sleep(0.5)
            out = (REPO / args.out).resolve()
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=2200,1250", "--virtual-time-budget=15000",
                            f"--screenshot={out}", f"{url}/#custom_scalars"],
                           check=True, timeout=120, capture_output=True)
        finally:
            tb.terminate()
            tb.wait(timeout=30)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
