"""Airflow plugin: serves `<STREAMDI_HOME>/reports/` (with its sub-folders) under /streamdi/reports/ and adds the
data-quality report (`REPORT_URL_PATH`: `reports/quality/index.html`, whose cells link into the Great Expectations
Data Docs in `reports/quality/data_docs/`), the batch log and the live windows (`reports/quality/windows.html`) to the
UI menu.

`streamdi airflow` (and the docker image) point Airflow's `plugins_folder` here. The reports are static files
written by the `streamdi_quality_report` DAG (or `streamdi quality report`); this plugin only serves them, and
only to a user logged in to Airflow (the UI's session cookie or an API bearer token, checked by Airflow's own
`get_user`): the pages show check results and failing values. Anyone else is sent to Airflow's login page, which
brings them back.
"""

from __future__ import annotations

from pathlib import Path

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, RedirectResponse, Response

from streamdi.report import render_placeholder
from streamdi.run.orchestration import BATCH_LOG_URL_PATH, REPORT_URL_PATH, WINDOWS_URL_PATH, reports_dir

_reports = reports_dir()
_PLACEHOLDERS = {
    "index.html": "streamdi batch report",
    "quality/index.html": "streamdi data-quality report",
    "quality/windows.html": "streamdi live windows",
}
for _name, _title in _PLACEHOLDERS.items():
    _page = _reports / _name
    _page.parent.mkdir(parents=True, exist_ok=True)
    if not _page.exists():
        _page.write_text(render_placeholder(_title))

app = FastAPI(title="streamdi reports")


@app.get("/reports/{path:path}")
def _report_file(path: str, user: GetUserDep) -> Response:
    """A file under `<STREAMDI_HOME>/reports/` (a folder: its index.html), for a logged-in user only."""
    file = _resolve(path)
    if file is None:
        raise HTTPException(status_code=404, detail=f"no report page {path!r}")
    if file.name == "index.html" and path and not path.endswith(("/", "index.html")):
        return RedirectResponse(f"{path.rsplit('/', 1)[-1]}/")  # a folder: its page's relative links need the slash
    return FileResponse(file)


@app.exception_handler(HTTPException)
async def _login_first(request: Request, exc: HTTPException) -> Response:
    """Not logged in (no, an expired or an invalid token): Airflow's login page, which comes back here."""
    if exc.status_code in (401, 403):
        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)))
    return await http_exception_handler(request, exc)


def _resolve(path: str) -> Path | None:
    """The file `path` names inside the reports folder (never outside it), or None."""
    root = _reports.resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        return None
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


@app.get("/")
def _root() -> RedirectResponse:
    return RedirectResponse(REPORT_URL_PATH)


class StreamdiReportsPlugin(AirflowPlugin):
    name = "streamdi_reports"
    fastapi_apps = [{"app": app, "url_prefix": "/streamdi", "name": "streamdi reports"}]
    external_views = [
        {"name": "streamdi quality report", "href": REPORT_URL_PATH, "destination": "nav", "category": "browse"},
        {"name": "streamdi batch log", "href": BATCH_LOG_URL_PATH, "destination": "nav", "category": "browse"},
        {"name": "streamdi live windows", "href": WINDOWS_URL_PATH, "destination": "nav", "category": "browse"},
    ]
