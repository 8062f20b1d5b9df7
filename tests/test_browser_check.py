"""The browser check (tools/browser_check.py) on a small site made to be broken in every way it
must catch, next to pages that are fine. `make test` runs the check itself on the built book."""

import importlib.metadata
import struct
import zlib
from pathlib import Path

import pytest

from browser_check import check_site, dead_links, html_pages

MATHJAX = Path(importlib.metadata.distribution("sphinx-mathjax-offline").locate_file("sphinx-mathjax-offline/static/mathjax"))
HEAD = """<html><head><script>window.MathJax = {{options: {{processHtmlClass: "math"}}}}</script>
<script defer src="{mathjax}"></script></head><body>{body}</body></html>"""


def png(width: int = 2, height: int = 2) -> bytes:
    """A valid grey PNG, written by hand."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / "mathjax").symlink_to(MATHJAX, target_is_directory=True)
    (root / "good.png").write_bytes(png())
    (root / "corrupt.png").write_bytes(b"not an image at all")
    page = lambda name, body, mathjax="mathjax/tex-chtml.js": (root / name).write_text(HEAD.format(mathjax=mathjax, body=body))
    page("index.html", '<p>Math <span class="math">\\(x^2 + 1\\)</span>.</p><div class="math">\\[\\sum_i x_i\\]</div>'
         '<img src="good.png"><a href="other.html#here">there</a> <a href="https://example.org/">outside</a>')
    page("other.html", '<h1 id="here">Here</h1><a href="index.html">back</a> <a href="#here">top</a>')
    page("broken.html", '<p>Math <span class="math">\\(y\\)</span>, and raw: $$z = 1$$</p>'
         '<img src="missing.png"><img src="corrupt.png"><img src="https://example.org/logo.png">'
         '<a href="nowhere.html">a</a> <a href="other.html#absent">b</a>'
         '<script>notAFunction()</script>', mathjax="no-mathjax-here/tex-chtml.js")
    page("texerror.html", '<p><span class="math">\\(\\frac{1}\\)</span> <span class="math">\\(\\nosuchmacro x\\)</span></p>')
    return root


@pytest.fixture(scope="module")
def report(site):
    return check_site(site, pages=["index.html", "other.html", "broken.html", "texerror.html"])


def test_pages_that_are_fine_pass(report):
    assert [p for p in report.problems if p.startswith(("index.html", "other.html"))] == []
    assert report.math >= 2


def test_every_kind_of_breakage_is_caught(report):
    broken = [p for p in report.problems if p.startswith("broken.html")]
    expected = [
        "broken.html: HTTP 404: missing.png",
        "broken.html: HTTP 404: no-mathjax-here/tex-chtml.js",
        "broken.html: image does not decode: missing.png",
        "broken.html: image does not decode: corrupt.png",
        "broken.html: image does not decode: https://example.org/logo.png",
        "broken.html: 1 math elements but MathJax did not load",
        "broken.html: raw TeX left in the text: ', and raw: $$z = 1$$'",
        "broken.html: JavaScript error: notAFunction is not defined",
        "broken.html: link to a missing file: nowhere.html",
        "broken.html: link to a missing anchor: other.html#absent",
    ]
    assert sorted(broken) == sorted(expected)
    assert sorted(p for p in report.problems if p.startswith("texerror.html")) == [
        "texerror.html: TeX error: Missing argument for \\frac", "texerror.html: TeX error: undefined \\nosuchmacro"]


def test_outside_requests_are_blocked_and_reported(report):
    assert report.blocked == {"https://example.org/logo.png"}  # a link is not a request
    assert "blocked outside request: https://example.org/logo.png" in report.problems


def test_pages_and_links_are_found_from_files(site, tmp_path):
    assert html_pages(site) == ["broken.html", "index.html", "other.html", "texerror.html"]
    base = "http://127.0.0.1:1/"
    links = {"a.html": [base + "other.html#here", base + "other.html#gone", base + "x/", "https://example.org/#y"]}
    assert dead_links(site, base, links, {"other.html": {"here"}}) == [
        "a.html: link to a missing anchor: other.html#gone", "a.html: link to a missing file: x/index.html"]


def test_a_missing_site_or_browser_is_a_clear_error(tmp_path, site):
    with pytest.raises(FileNotFoundError, match="build the book first"):
        check_site(tmp_path)
    with pytest.raises(FileNotFoundError, match="chromium: /nonexistent/chromium does not exist"):
        check_site(site, chromium="/nonexistent/chromium")
