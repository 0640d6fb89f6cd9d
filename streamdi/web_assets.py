"""The stylesheets, scripts and fonts of Great Expectations' Data Docs, served with the report instead of from CDNs.

GX's page templates load Bootstrap, jQuery, bootstrap-table, Font Awesome, Vega and a few more from public CDNs
(`CDN_FILES`) and its logo from a public bucket. Offline (or behind a proxy) the pages then lose their styles, their
status icons and, with jQuery missing, the index page's list. streamdi takes the same files, at the same versions,
from the npm registry once (`fetch`, run by `python3 bootstrap.py setup`; each package tarball is checked against
its pinned sha512), keeps them in the virtual environment (`ASSET_DIR`), and `localize` copies them into a built
site and points every page at the copies by relative paths (the logo comes from the GX package itself), so the
report folder is self-contained: it works from disk, behind Airflow's login, and offline.

`python -m streamdi.web_assets fetch` fetches what is missing; `path` prints where the assets live.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ASSET_DIR = Path(sys.prefix) / "share" / "streamdi" / "web"  # inside the virtual environment, like the JVM archive
REGISTRY = "https://registry.npmjs.org"
VENDOR = "static/vendor"  # inside a Data Docs site


@dataclass(frozen=True)
class Package:
    """An npm package version: its tarball's sha512 (the registry's `dist.integrity`) and what streamdi takes from it
    (paths inside the package; a folder is taken whole)."""

    name: str
    version: str
    integrity: str
    paths: tuple[str, ...]

    @property
    def folder(self) -> str:
        return f"{self.name.replace('/', '+')}@{self.version}"

    @property
    def tarball(self) -> str:
        return f"{REGISTRY}/{self.name}/-/{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"


PACKAGES: tuple[Package, ...] = (
    Package(
        "bootstrap",
        "4.3.1",
        "sha512-rXqOmH1VilAt2DyPzluTi2blhk17bO7ef+zLLPlWvG494pDxcM234pJ8wTc/6R40UWizAIIMgxjvxZg5kmsbag==",
        ("dist/css/bootstrap.min.css", "dist/js/bootstrap.min.js"),
    ),
    Package(
        "jquery",
        "3.7.1",
        "sha512-m4avr8yL8kmFN8psrbFFFmB/If14iN5o9nw/NgnnM+kybDJpRsAynV2BsfpTYrTRysYUdADVD7CkUUizgkpLfg==",
        ("dist/jquery.min.js",),
    ),
    Package(
        "popper.js",
        "1.12.9",
        "sha512-s0EEi9xiSCdqz9lV4IiVH5yIZnDX/U1t0tCjB+0jXx9jW8lrR7kOpVupiUg175ogqVoudpDXHF1p6dKATCHMeg==",
        ("dist/umd/popper.min.js",),
    ),
    Package(
        "bootstrap-table",
        "1.19.0",
        "sha512-L+USHm3X9FKocx/6yngGu12yF6r6s1Ntuc+hoIK2a2QQJjHw5kcySLiE2HY/9sEaSGAOfPbfQOtBH3uKkcpqEA==",
        (
            "dist/extensions/filter-control/bootstrap-table-filter-control.css",
            "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
        ),
    ),
    Package(
        "bootstrap-table",
        "1.19.1",
        "sha512-WvV+l1AI/C+zThaKmfHmi/IuayVNB0qdFyEhFx1jyZhO0oLtNJNANkCR3rvJf6Dkh72dsLElxpE/bzK9seEQLA==",
        (
            "dist/bootstrap-table.min.css",
            "dist/bootstrap-table.min.js",
            "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
        ),
    ),
    Package(
        "bootstrap-datepicker",
        "1.9.0",
        "sha512-9rYYbaVOheGYxjOr/+bJCmRPihfy+LkLSg4fIFMT9Od8WwWB/MB50w0JO1eBgKUMbb7PFHQD5uAfI3ArAxZRXA==",
        ("dist/css/bootstrap-datepicker.min.css", "dist/js/bootstrap-datepicker.min.js"),
    ),
    Package(
        "@fortawesome/fontawesome-free",
        "6.6.0",
        "sha512-60G28ke/sXdtS9KZCpZSHHkCbdsOGEhIUGlwq6yhY74UpTiToIh8np7A8yphhM4BWsvNFtIvLpi4co+h9Mr9Ow==",
        ("css/all.min.css", "webfonts"),  # the stylesheet loads its fonts from ../webfonts/
    ),
    Package(
        "@forevolve/bootstrap-dark",
        "1.1.0",
        "sha512-A3ucpEpxPoTVO490lZZCfjPXxv832l7mm1IxX3bXyxvgwnPGXDLyh7dWrphXKO8YBAu3EswbBEu3VSW8NRMW3A==",
        ("dist/css/bootstrap-prefers-dark.css",),
    ),
    Package(
        "vega",
        "5.33.1",
        "sha512-1fArfVDUqVbb5z8n+/nVQb+VNBzx8svY6CrsyTK4Ujm4yrd9I1auoKxBAPXLCavY1LcrbHUskQbGUP8gXOzyQw==",
        ("build/vega.min.js",),
    ),
    Package(
        "vega-lite",
        "5.23.0",
        "sha512-l4J6+AWE3DIjvovEoHl2LdtCUkfm4zs8Xxx7INwZEAv+XVb6kR6vIN1gt3t2gN2gs/y4DYTs/RPoTeYAuEg6mA==",
        ("build/vega-lite.min.js",),
    ),
    Package(
        "vega-embed",
        "6.29.0",
        "sha512-PmlshTLtLFLgWtF/b23T1OwX53AugJ9RZ3qPE2c01VFAbgt3/GSNI/etzA/GzdrkceXFma+FDHNXUppKuM0U6Q==",
        ("build/vega-embed.min.js",),
    ),
)

_BY_KEY = {(p.name, p.version): p for p in PACKAGES}

# Every URL GX's templates load (GX 1.x: `render/view/templates/*.j2`), and the file of which package replaces it.
# `vega@5` and the like are major-version ranges on the CDN; the newest release of that major version stands for them.
CDN_FILES: dict[str, tuple[Package, str]] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": (
        _BY_KEY["bootstrap", "4.3.1"],
        "dist/css/bootstrap.min.css",
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": (
        _BY_KEY["bootstrap", "4.3.1"],
        "dist/js/bootstrap.min.js",
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": (_BY_KEY["jquery", "3.7.1"], "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": (
        _BY_KEY["popper.js", "1.12.9"],
        "dist/umd/popper.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        _BY_KEY["bootstrap-table", "1.19.0"],
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        _BY_KEY["bootstrap-table", "1.19.0"],
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        _BY_KEY["bootstrap-table", "1.19.1"],
        "dist/bootstrap-table.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        _BY_KEY["bootstrap-table", "1.19.1"],
        "dist/bootstrap-table.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        _BY_KEY["bootstrap-table", "1.19.1"],
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        _BY_KEY["bootstrap-datepicker", "1.9.0"],
        "dist/css/bootstrap-datepicker.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        _BY_KEY["bootstrap-datepicker", "1.9.0"],
        "dist/js/bootstrap-datepicker.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        _BY_KEY["@fortawesome/fontawesome-free", "6.6.0"],
        "css/all.min.css",
    ),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        _BY_KEY["@forevolve/bootstrap-dark", "1.1.0"],
        "dist/css/bootstrap-prefers-dark.css",
    ),
    "https://cdn.jsdelivr.net/npm/vega@5": (_BY_KEY["vega", "5.33.1"], "build/vega.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": (_BY_KEY["vega-lite", "5.23.0"], "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": (_BY_KEY["vega-embed", "6.29.0"], "build/vega-embed.min.js"),
}
# GX's logo, from its public bucket with a cache-busting query; the same image ships in the GX package.
_GX_LOGO = re.compile(r"https://great-expectations-web-assets\.s3\.[a-z0-9-]+\.amazonaws\.com/(logo-long\.png)[^\"']*")
_RESOURCE = re.compile(r"""(?:src|href)\s*=\s*["'](https?://[^"']+)["']""")


class AssetsMissing(RuntimeError):
    """The assets are not in `ASSET_DIR` and could not be fetched."""


def missing(directory: Path = ASSET_DIR) -> list[Package]:
    return [p for p in PACKAGES if not all((directory / p.folder / path).exists() for path in p.paths)]


def fetch(directory: Path = ASSET_DIR, *, timeout: float = 60) -> list[str]:
    """Download and unpack the packages not in `directory` yet; returns their names. Raises AssetsMissing when one
    cannot be fetched or does not match its pinned sha512."""
    fetched = []
    for package in missing(directory):
        try:
            with urllib.request.urlopen(package.tarball, timeout=timeout) as response:
                data = response.read()
        except OSError as e:
            raise AssetsMissing(f"could not download {package.tarball}: {e}") from e
        digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
        if digest != package.integrity:
            raise AssetsMissing(f"{package.tarball} does not match its pinned sha512 ({digest})")
        _unpack(package, data, directory)
        fetched.append(f"{package.name}@{package.version}")
    return fetched


def _unpack(package: Package, data: bytes, directory: Path) -> None:
    """The package's wanted paths, into `directory/<folder>/` (written aside, then renamed into place)."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{package.folder}-", dir=directory))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive.getmembers():
                inner = member.name.split("/", 1)[1] if "/" in member.name else ""  # below the tarball's top folder
                wanted = any(inner == p or inner.startswith(p.rstrip("/") + "/") for p in package.paths)
                if not wanted or not member.isfile():
                    continue
                target = staging / inner
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.extractfile(member).read())
        final = directory / package.folder
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def rewrite(page: str, to_vendor: str) -> str:
    """`page` (HTML) with every known CDN URL replaced by the path of its copy under `to_vendor` (the relative
    path from the page's folder to the site's vendor folder) and GX's logo by the copy there. Other URLs (links to
    web sites) are left alone."""
    for url, (package, path) in CDN_FILES.items():
        page = page.replace(f'"{url}"', f'"{to_vendor}/{package.folder}/{path}"')
    return _GX_LOGO.sub(lambda m: f"{to_vendor}/great_expectations/{m.group(1)}", page)


def external_resources(page: str) -> list[str]:
    """The http(s) URLs a page loads as a script, stylesheet or image (`src=`, `<link href=`), not plain links."""
    found = []
    for tag in re.findall(r"<(?:script|link|img)\b[^>]*>", page):
        found += _RESOURCE.findall(tag)
    return found


def localize(site: Path, directory: Path = ASSET_DIR) -> int:
    """Copy the assets into `site/static/vendor/` and point every HTML page of `site` at them; returns the number of
    pages changed. Fetches missing assets first; raises AssetsMissing when that fails (the site keeps its CDN
    links then)."""
    if missing(directory):
        fetch(directory)
    vendor = site / VENDOR
    for package in PACKAGES:
        shutil.copytree(directory / package.folder, vendor / package.folder, dirs_exist_ok=True)
    logo = _gx_image("logo-long.png")
    (vendor / "great_expectations").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(logo, vendor / "great_expectations" / logo.name)
    changed = 0
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = rewrite(text, os.path.relpath(vendor, page.parent).replace(os.sep, "/"))
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed += 1
    return changed


def _gx_image(name: str) -> Path:
    from streamdi.gx_import import import_great_expectations

    return Path(import_great_expectations().__file__).parent / "render" / "view" / "static" / "images" / name


def main(argv: list[str] | None = None) -> None:
    """The command line: `python -m streamdi.web_assets fetch` or `path`. typer is imported here, not at the top, so
    that building a report (which imports this module for `localize`) does not pay for it."""
    import typer

    from streamdi.scripts import script_app

    app = script_app(help=__doc__.splitlines()[0], no_args_is_help=True)

    @app.command("fetch")
    def fetch_command() -> None:
        """fetch what is missing from the npm registry (into the virtual environment)"""
        try:
            fetched = fetch()
        except AssetsMissing as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(1) from None
        print(f"Data Docs assets in {ASSET_DIR}: " + (f"fetched {', '.join(fetched)}" if fetched else "all there"))

    @app.command("path")
    def path_command() -> None:
        """print where the assets live"""
        print(ASSET_DIR)

    app(args=argv, prog_name="python -m streamdi.web_assets")


if __name__ == "__main__":
    main()
