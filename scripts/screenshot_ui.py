"""Screenshot of the `pipeline` deployment's run form in the Prefect UI, for the README.

Starts a real Prefect server on 127.0.0.1, registers the deployments as `make ui` serves them,
and points headless Chromium (Debian's `chromium` package) at the deployment's custom-run page.

    .venv/bin/python scripts/screenshot_ui.py [--out docs/prefect-run-form.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "prefect-run-form.png")
    parser.add_argument("--size", default="1280,1500")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise SystemExit("error: no chromium on PATH (Debian: apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="rollwise-shot-"))
    os.environ.update(PREFECT_HOME=str(work / "home"), **servers.QUIET_ENV)
    server = servers.start_prefect(work / "prefect")
    try:
        os.environ["PREFECT_API_URL"] = server.url
        from flows.serve import DEPLOYMENTS

        ids = {name: flow.to_deployment(name=name).apply() for name, flow in DEPLOYMENTS.items()}
        page = f"{server.url.removesuffix('/api')}/deployments/deployment/{ids['pipeline']}/run"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={args.size}", "--virtual-time-budget=20000",
             f"--screenshot={args.out.resolve()}", page],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        print(f"{args.out} <- {page}")
    finally:
        servers.stop(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
