"""Airflow plugin: serves `<STREAMDI_HOME>/reports/` under /streamdi/reports/ and adds it to the UI menu.

`streamdi airflow` (and the docker image) point Airflow's `plugins_folder` here. The reports are static files
written by the `streamdi_quality_report` DAG; this plugin only serves them.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from streamdi.orchestration import REPORT_URL_PATH, reports_dir

_reports = reports_dir()
_reports.mkdir(parents=True, exist_ok=True)
if not (_reports / "index.html").exists():
    (_reports / "index.html").write_text(
        "<!doctype html><html><body><h1>streamdi batch report</h1>"
        "<p>No report yet: trigger the streamdi_quality_report DAG.</p></body></html>\n"
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
