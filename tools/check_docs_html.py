#!/usr/bin/python3
"""Checks the built HTML docs in a real (headless) browser.

    /usr/bin/python3 tools/check_docs_html.py [--html build/docs/html] [PAGE.html ...]

Opens the main page and every chapter's lesson page (chapters/NN_*/README.md,
whose {#label} names the page label.html) from the HTML folder with

    chromium --headless --disable-gpu --no-sandbox --virtual-time-budget=10000 --dump-dom file://...

and reads the DOM after the scripts ran. A page fails when

- a formula is left unprocessed: raw TeX delimiters \\( \\[ $$ (or the
  lesson filter's \\f$ \\f[) in the text outside MathJax's output, code and
  scripts; a <script type="math/tex"> without the rendered MathJax element
  next to it; or a MathJax error (class merror);
- Markdown bold is left raw (** in the text; Doxygen 1.9 does that to bold
  around a formula or a code span, which docs/markdown_math.py works around);
- an <img> points outside the HTML folder or to a file missing from it, or to
  a file that is not a readable image with a non-zero width (what would give
  naturalWidth 0 in the browser).

One line per page; exit status 0 when every page passes, 1 otherwise, and 77
(CTest's SKIP_RETURN_CODE) with "chromium not installed: skipped" where no
Chromium is installed (Debian: apt-get install chromium). Standard library only.
"""
import argparse
import glob
import html.parser
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SKIP = 77

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
        "track", "wbr"}
# Text inside these is not a formula to render (MathJax 2 skips them too).
NOT_MATH_TAGS = {"script", "style", "noscript", "textarea", "pre", "code", "svg"}
# Doxygen's code blocks and MathJax's own output (2: MathJax*, 3: mjx-*).
NOT_MATH_CLASSES = re.compile(r"^(fragment|tex2jax_ignore|MathJax\w*)$")
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$|\\f\$|\\f\[")
RAW_BOLD = re.compile(r"\*\*(?=\S)|(?<=\S)\*\*")


class Page(html.parser.HTMLParser):
    """What the check needs from a dumped DOM."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []  # (tag, skips text, is merror)
        self.raw = []  # text snippets with raw TeX
        self.bold = []  # text snippets with Markdown bold left raw
        self.errors = []  # MathJax error texts
        self.formulas = {}  # script id -> TeX source
        self.frames = set()  # ids of rendered MathJax elements
        self.rendered3 = 0  # MathJax 3 output elements
        self.images = []
        self.mathjax_src = None
        self._script = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "img":
            self.images.append(a.get("src") or "")
        if tag == "script":
            src = a.get("src") or ""
            if re.search(r"(^|/)(MathJax|tex-\w+)\.js", src):
                self.mathjax_src = src
            kind = (a.get("type") or "").split(";")[0].strip()
            if kind == "math/tex":
                self._script = a.get("id") or f"(no id {len(self.formulas)})"
                self.formulas[self._script] = ""
        if tag == "mjx-container":
            self.rendered3 += 1
        frame = a.get("id") or ""
        if frame.endswith("-Frame"):
            self.frames.add(frame[: -len("-Frame")])
        if tag in VOID:
            return
        skips = tag in NOT_MATH_TAGS or tag.startswith("mjx-") or any(NOT_MATH_CLASSES.match(c) for c in classes)
        self.stack.append((tag, skips, "merror" in classes))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        # A well-formed dump closes in order; tolerate strays by searching back.
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if tag == "script":
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self.formulas[self._script] += data
            return
        if any(error for _, _, error in self.stack):
            self.errors.append(data.strip())
            return
        if any(skips for _, skips, _ in self.stack):
            return
        for pattern, found in ((RAW_TEX, self.raw), (RAW_BOLD, self.bold)):
            for match in pattern.finditer(data):
                start = max(match.start() - 30, 0)
                found.append(" ".join(data[start:match.end() + 30].split()))


def image_width(path):
    """The width of a PNG, GIF, JPEG or SVG file; 0 when it cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(32)
            if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
                return struct.unpack(">I", head[16:20])[0]
            if head[:6] in (b"GIF87a", b"GIF89a"):
                return struct.unpack("<H", head[6:8])[0]
            if head.startswith(b"\xff\xd8"):
                f.seek(2)
                while True:
                    marker = f.read(4)
                    if len(marker) < 4 or marker[0] != 0xFF:
                        return 0
                    length = struct.unpack(">H", marker[2:4])[0]
                    if 0xC0 <= marker[1] <= 0xCF and marker[1] not in (0xC4, 0xC8, 0xCC):
                        return struct.unpack(">H", f.read(5)[3:5])[0]
                    f.seek(length - 2, 1)
        if path.endswith(".svg"):
            root = ElementTree.parse(path).getroot()
            width = root.get("width") or (root.get("viewBox") or "0 0 0 0").split()[2]
            return float(re.match(r"[\d.]*", width).group() or 0)
    except (OSError, struct.error, ElementTree.ParseError, IndexError, ValueError):
        return 0
    return 0


def lesson_pages(html_dir):
    """The chapters' lesson pages: label.html for a README starting with '# ... {#label}'."""
    pages = []
    for readme in sorted(glob.glob(os.path.join(ROOT, "chapters", "[0-9][0-9]_*", "README.md"))):
        with open(readme, encoding="utf-8") as f:
            match = re.search(r"\{#([\w-]+)\}", f.readline())
        if match:
            pages.append(match.group(1) + ".html")
        else:  # Doxygen's name for a Markdown page without a label
            relative = os.path.relpath(readme, ROOT)
            pages.append("md_" + re.sub(r"[/.]", "_", relative[: -len(".md")]) + ".html")
    if not pages:  # not run from a checkout: whatever the folder has
        pages = sorted(os.path.basename(p) for p in glob.glob(os.path.join(html_dir, "chapter*.html")))
    return pages


def dump_dom(browser, url, budget_ms, timeout):
    with tempfile.TemporaryDirectory(prefix="dtp-docs-check-") as profile:
        command = [browser, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
                   f"--virtual-time-budget={budget_ms}", "--dump-dom", url]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return result


def check_page(browser, html_dir, name, args):
    """(ok, one-line summary) for one page."""
    path = os.path.join(html_dir, name)
    if not os.path.isfile(path):
        return False, f"{name}: FAIL: the page is missing from {html_dir}"
    url = urllib.parse.urljoin("file:", urllib.request.pathname2url(os.path.abspath(path)))
    try:
        result = dump_dom(browser, url, args.budget_ms, args.timeout)
    except subprocess.TimeoutExpired:
        return False, f"{name}: FAIL: {os.path.basename(browser)} did not finish in {args.timeout} s"
    if result.returncode != 0 or "<html" not in result.stdout:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"{name}: FAIL: {os.path.basename(browser)} exited {result.returncode}: {last}"
    page = Page()
    page.feed(result.stdout)
    page.close()

    problems = []
    unrendered = [tex for key, tex in page.formulas.items() if key not in page.frames]
    if page.raw or unrendered:
        where = page.mathjax_src or "no MathJax script"
        hint = " (it loads from the network: install libjs-mathjax and reconfigure)" \
            if re.match(r"https?:", page.mathjax_src or "") else ""
        shown = (page.raw + [" ".join(t.split())[:60] for t in unrendered])[:3]
        problems.append(f"{len(page.raw) + len(unrendered)} formula(s) not rendered by MathJax "
                        f"[{where}]{hint}, e.g. " + " | ".join(repr(s) for s in shown))
    if page.bold:
        problems.append(f"{len(page.bold)} Markdown bold marker(s) left raw, e.g. "
                        + " | ".join(repr(s) for s in page.bold[:3]))
    if page.errors:
        problems.append(f"{len(page.errors)} MathJax error(s): " + " | ".join(repr(e) for e in page.errors[:3]))

    html_root = os.path.realpath(html_dir)
    page_dir = os.path.dirname(os.path.realpath(path))
    bad_images, seen = [], set()
    for src in page.images:
        if src in seen:
            continue
        seen.add(src)
        parts = urllib.parse.urlsplit(src)
        if parts.scheme == "data":
            continue
        if parts.scheme and parts.scheme != "file":
            bad_images.append(f"{src} (not in the HTML folder)")
            continue
        target = urllib.request.url2pathname(parts.path)
        target = os.path.realpath(target if parts.scheme == "file" else os.path.join(page_dir, target))
        if os.path.commonpath([target, html_root]) != html_root:
            bad_images.append(f"{src} (outside the HTML folder)")
        elif not os.path.isfile(target):
            bad_images.append(f"{src} (missing)")
        elif image_width(target) <= 0:
            bad_images.append(f"{src} (not a readable image: naturalWidth would be 0)")
    if bad_images:
        problems.append(f"{len(bad_images)} broken image(s): " + ", ".join(bad_images))

    rendered = len(page.formulas) - len(unrendered) + page.rendered3
    counts = f"{rendered} formula(s) rendered, {len(seen)} image(s)"
    if problems:
        return False, f"{name}: FAIL ({counts}): " + "; ".join(problems)
    return True, f"{name}: ok, {counts}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="*",
                        help="pages to check, relative to the HTML folder [index.html and every chapter's lesson]")
    parser.add_argument("--html", default=os.path.join(ROOT, "build", "docs", "html"),
                        help="the HTML folder the docs target wrote [build/docs/html of this repository]")
    parser.add_argument("--browser", default=None, help=f"the browser to run [the first of {', '.join(BROWSERS)}]")
    parser.add_argument("--budget-ms", type=int, default=10000,
                        help="virtual time the page's scripts get before the DOM is dumped [10000]")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one page may take [120]")
    args = parser.parse_args()

    browser = args.browser or next((b for b in map(shutil.which, BROWSERS) if b), None)
    if not browser or not shutil.which(browser):
        print("chromium not installed: skipped")
        return SKIP
    if not os.path.isfile(os.path.join(args.html, "index.html")):
        print(f"{args.html}/index.html is missing: build the docs first (cmake --build build --target docs)")
        return 1
    pages = args.pages or ["index.html"] + lesson_pages(args.html)
    failed = 0
    for name in pages:
        ok, line = check_page(browser, args.html, name, args)
        print(line, flush=True)
        failed += not ok
    print(f"docs html: {len(pages) - failed} of {len(pages)} page(s) pass in {os.path.basename(browser)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
