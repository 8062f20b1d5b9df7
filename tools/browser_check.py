"""Open every page of the built book in headless Chromium and fail on what a reader would meet.

    python tools/browser_check.py _build/html [--chromium /usr/bin/chromium]   (default: $CHROMIUM)

The site is served on 127.0.0.1; every request to anywhere else is blocked and recorded. A
page fails on an image that does not decode, an internal link to a page or anchor that does
not exist, math that MathJax did not typeset (or raw TeX left in the text), an HTTP status of
400 or more, and a JavaScript error. Screenshots of the landing page and of one chapter go to a
new temporary folder, whose paths are printed. Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

# Known, harmless errors, by exact message. sphinx-thebe 0.3.1 adds its configuration script
# to a page twice (its set-up runs on two build events), so the second copy's `const
# THEBE_JS_URL` is a redeclaration; the first copy has defined it, and nothing else is lost.
ALLOWED_JS_ERRORS = {"Identifier 'THEBE_JS_URL' has already been declared"}
# Outside requests a page makes but does not need. Each chapter's "Open in Colab" badge is
# Colab's own image: online it shows; offline the link beside it is still there.
ALLOWED_BLOCKED = {"https://colab.research.google.com/assets/colab-badge.svg"}
# Chromium, started the way a machine with no outside network needs (no background fetches).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REFRESH = re.compile(r'<meta http-equiv="refresh" content="\d+; url=([^"]+)"', re.IGNORECASE)
LANDING, CHAPTER = "book/intro.html", "notebooks/06_layernorm_in_transformers.html"

# Runs in the page once it has loaded: waits for MathJax and for every image, then reports.
INSPECT = """async () => {
  const math = [...document.querySelectorAll('.math')];
  let mathjax = 'absent';
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise; mathjax = 'ready';
  }
  const skip = 'script, style, pre, code, .highlight, .math, mjx-container, textarea';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const rawTex = [];
  while (walker.nextNode()) {
    const t = walker.currentNode.textContent;
    if (/\\\\\\(|\\\\\\[|\\$\\$|\\\\begin\\{/.test(t) && !walker.currentNode.parentElement.closest(skip))
      rawTex.push(t.trim().slice(0, 80));
  }
  const images = await Promise.all([...document.images].map(async (img) => {
    img.loading = 'eager';
    try { await img.decode(); return null; } catch (e) { return img.getAttribute('src'); }
  }));
  return {
    mathjax,
    math: math.length,
    untypeset: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.trim().slice(0, 80)),
    texErrors: [...document.querySelectorAll('mjx-merror')].map(m => m.getAttribute('data-mjx-error') || m.textContent)
      .concat([...document.querySelectorAll('mjx-assistive-mml mtext[mathcolor="red"]')]  // an undefined macro
      .map(m => 'undefined ' + m.textContent)),
    rawTex,
    brokenImages: images.filter(s => s !== null),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id).concat(
         [...document.querySelectorAll('a[name]')].map(a => a.name)),
  };
}"""


@dataclass
class Report:
    pages: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)
    math: int = 0
    screenshots: list[Path] = field(default_factory=list)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # the browser hung up: nothing lost
            super().handle_error(request, client_address)


def serve(root: Path) -> ThreadingHTTPServer:
    """Serve ``root`` on 127.0.0.1 at a free port, from a daemon thread."""
    server = _Server(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def html_pages(root: Path) -> list[str]:
    """Every HTML page of the site, relative to ``root``; the theme's own folders excluded."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(root).parts))


def local_browser(pw, chromium: str, base: str, blocked: set[str]):
    """``(browser, context)``: Chromium at ``chromium``, started by Playwright's ``pw``, whose
    context lets through only requests to ``base`` and adds every other URL to ``blocked``."""
    browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")

    def route(r):
        if r.request.url.startswith(base):
            return r.continue_()
        blocked.add(r.request.url)
        return r.abort("blockedbyclient")

    context.route("**/*", route)
    return browser, context


def check_site(root: Path, chromium: str = os.environ.get("CHROMIUM", "/usr/bin/chromium"), screenshots: Path | None = None,
               pages: list[str] | None = None) -> Report:
    """Open ``pages`` (default: all of them) of the site at ``root``; return what went wrong."""
    from playwright.sync_api import sync_playwright

    root = Path(root).resolve()
    if not (root / "index.html").is_file() and pages is None:
        raise FileNotFoundError(f"root: {root} holds no index.html; build the book first (make book)")
    if not Path(chromium).is_file():
        raise FileNotFoundError(f"chromium: {chromium} does not exist; install Debian's chromium "
                                "package (make setup does, as root) or pass --chromium")
    report = Report(pages=pages if pages is not None else html_pages(root))
    server = serve(root)
    base = f"http://127.0.0.1:{server.server_port}/"
    ids: dict[str, set[str]] = {}
    links: dict[str, list[str]] = {}
    try:
        with sync_playwright() as pw:
            browser, context = local_browser(pw, chromium, base, report.blocked)
            for name in report.pages:
                page = context.new_page()
                found: list[str] = []
                page.on("pageerror", lambda e, f=found: f.append(f"JavaScript error: {e.message}")
                        if e.message not in ALLOWED_JS_ERRORS else None)
                page.on("console", lambda m, f=found: f.append(f"console error: {m.text}")
                        if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
                page.on("response", lambda r, f=found: f.append(f"HTTP {r.status}: {r.url[len(base):]}")
                        if r.status >= 400 else None)
                page.goto(base + name, wait_until="load")
                redirect = REFRESH.search((root / name).read_text(errors="replace"))
                if redirect:  # a page that only forwards: wait for its target
                    page.wait_for_url(urljoin(base + name, redirect.group(1)), wait_until="load")
                seen = page.evaluate(INSPECT)
                report.math += seen["math"]
                if seen["math"] and seen["mathjax"] != "ready":
                    found.append(f"{seen['math']} math elements but MathJax did not load")
                elif seen["untypeset"]:
                    found.append(f"{len(seen['untypeset'])} math elements not typeset, first: {seen['untypeset'][0]!r}")
                found += [f"TeX error: {e}" for e in seen["texErrors"]]
                found += [f"raw TeX left in the text: {t!r}" for t in seen["rawTex"]]
                found += [f"image does not decode: {src}" for src in seen["brokenImages"]
                          if src not in ALLOWED_BLOCKED]
                if screenshots is not None and name in (LANDING, CHAPTER):
                    path = screenshots / (Path(name).stem + ".png")
                    page.screenshot(path=str(path), full_page=name == LANDING)
                    report.screenshots.append(path)
                ids[name], links[name] = set(seen["ids"]), seen["links"]
                report.problems += [f"{name}: {p}" for p in found]
                page.close()
            browser.close()
    finally:
        server.shutdown()
    report.problems += dead_links(root, base, links, ids)
    report.problems += [f"blocked outside request: {url}" for url in sorted(report.blocked - ALLOWED_BLOCKED)]
    return report


def dead_links(root: Path, base: str, links: dict[str, list[str]], ids: dict[str, set[str]]) -> list[str]:
    """Internal links whose file, or whose anchor in an opened page, does not exist."""
    dead = []
    for name, hrefs in links.items():
        for href in hrefs:
            url, anchor = urldefrag(href)
            if not url.startswith(base):
                continue  # outside links are not followed
            target = unquote(urlsplit(url).path)[1:] or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if not (root / target).is_file():
                dead.append(f"{name}: link to a missing file: {target}")
            elif anchor and target in ids and unquote(anchor) not in ids[target]:
                dead.append(f"{name}: link to a missing anchor: {target}#{anchor}")
    return sorted(set(dead))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the built site, e.g. _build/html")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"), help="the Chromium executable")
    args = parser.parse_args(argv)
    shots = Path(tempfile.mkdtemp(prefix="lnbook-screenshots-"))
    report = check_site(args.root, args.chromium, shots)
    print(f"browser check: {len(report.pages)} pages opened in Chromium, {report.math} math elements checked")
    for name in report.pages:
        print(f"  {name}")
    print(f"blocked outside requests ({len(report.blocked)}):" if report.blocked else "blocked outside requests: none")
    for url in sorted(report.blocked):
        print(f"  {url}{' (allowed: not needed by the page)' if url in ALLOWED_BLOCKED else ''}")
    for path in report.screenshots:
        print(f"screenshot: {path}")
    for problem in report.problems:
        print(f"FAIL {problem}")
    print(f"browser check: {len(report.problems)} problems" if report.problems else "browser check: passed")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
