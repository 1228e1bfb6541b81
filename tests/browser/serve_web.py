"""Run `voice-gateway serve ...` with `web/` served at `/`, for the browser tests and local development.

Once the product app mounts `web/` itself this adds nothing: it mounts only when no route or mount answers `/`.
Usage: python tests/browser/serve_web.py [serve arguments...]   (the same arguments as `voice-gateway serve`)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WEB_DIR = REPO / "web"


def _serves_root(app) -> bool:
    for route in app.routes:
        path = getattr(route, "path", None)
        if path in ("", "/"):
            return True
    return False


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from fastapi.staticfiles import StaticFiles

    import voice_gateway.app as app_module
    from voice_gateway import cli

    real_create_app = app_module.create_app

    def create_app(*args, **kwargs):
        app = real_create_app(*args, **kwargs)
        if not _serves_root(app):
            app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
        return app

    app_module.create_app = create_app  # cli.serve imports it from the module at call time
    return cli.main(["serve", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
