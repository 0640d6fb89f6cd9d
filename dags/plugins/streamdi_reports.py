"""Airflow plugin: serves `<STREAMDI_HOME>/reports/` (with its sub-folders) under /streamdi/reports/ and adds the
data-quality report (`REPORT_URL_PATH`: `reports/quality/index.html`, whose cells link into the Great Expectations
Data Docs in `reports/quality/data_docs/`) to the UI menu.

`streamdi airflow` (and the docker image) point Airflow's `plugins_folder` here. The reports are static files
written by the `streamdi_quality_report` DAG (or `streamdi quality report`); this plugin only serves them.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from streamdi.orchestration import REPORT_URL_PATH, reports_dir

_reports = reports_dir()
_PLACEHOLDERS = {
    "index.html": "streamdi batch report",
    "quality/index.html": "streamdi data-quality report",
}
for _name, _title in _PLACEHOLDERS.items():
    _page = _reports / _name
    _page.parent.mkdir(parents=True, exist_ok=True)
    if not _page.exists():
        _page.write_text(
            f"<!doctype html><html><body><h1>{_title}</h1>"
            "<p>No report yet: trigger the streamdi_quality_report DAG (or run `streamdi quality report`).</p>"
            "</body></html>\n"
        )

app = FastAPI(title="streamdi reports")
app.mount("/reports", StaticFiles(directory=_reports, html=True), name="reports")


@app.get("/")
def _root() -> RedirectResponse:
    return RedirectResponse(REPORT_URL_PATH)


class StreamdiReportsPlugin(AirflowPlugin):
    name = "streamdi_reports"
    fastapi_apps = [{"app": app, "url_prefix": "/streamdi", "name": "streamdi reports"}]
    external_views = [
        {"name": "streamdi quality report", "href": REPORT_URL_PATH, "destination": "nav", "category": "browse"}
    ]
