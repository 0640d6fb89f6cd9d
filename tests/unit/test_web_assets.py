"""The Data Docs' CDN files are replaced by local copies: every URL GX's templates load is known, and pages at any
depth point at the copies by relative paths."""

from __future__ import annotations

import re
from pathlib import Path

import great_expectations

from streamdi import web_assets

TEMPLATES = Path(great_expectations.__file__).parent / "render" / "view" / "templates"


def test_every_resource_url_of_the_gx_templates_has_a_local_copy():
    loaded = set()
    for template in TEMPLATES.glob("*.j2"):
        for tag in re.findall(r"<(?:script|link)\b[^>]*>", template.read_text()):
            loaded.update(re.findall(r"""(?:src|href)="(https?://[^"{]+)""", tag))
    assert loaded  # the templates still load from CDNs: else this module has nothing left to do
    assert loaded <= set(web_assets.CDN_FILES), sorted(loaded - set(web_assets.CDN_FILES))


def test_a_page_points_at_the_copies_relative_to_its_folder():
    page = (
        '<link href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css" rel="stylesheet">'
        '<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>'
        '<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>'
        '<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=20261125T1">'
        '<a href="https://greatexpectations.io/newsletter">Subscribe</a>'
    )
    out = web_assets.rewrite(page, "../../static/vendor")
    assert out == (
        '<link href="../../static/vendor/bootstrap@4.3.1/dist/css/bootstrap.min.css" rel="stylesheet">'
        '<script src="../../static/vendor/jquery@3.7.1/dist/jquery.min.js"></script>'
        '<script src="../../static/vendor/vega@5.33.1/build/vega.min.js"></script>'
        '<img src="../../static/vendor/great_expectations/logo-long.png">'
        '<a href="https://greatexpectations.io/newsletter">Subscribe</a>'
    )
    assert web_assets.external_resources(page) == [
        "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css",
        "https://code.jquery.com/jquery-3.7.1.min.js",
        "https://cdn.jsdelivr.net/npm/vega@5",
        "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=20261125T1",
    ]
    assert web_assets.external_resources(out) == []  # the plain link is not a resource


def test_npm_tarball_addresses():
    by_name = {p.name: p for p in web_assets.PACKAGES}
    assert by_name["jquery"].tarball == "https://registry.npmjs.org/jquery/-/jquery-3.7.1.tgz"
    assert (
        by_name["@fortawesome/fontawesome-free"].tarball
        == "https://registry.npmjs.org/@fortawesome/fontawesome-free/-/fontawesome-free-6.6.0.tgz"
    )
