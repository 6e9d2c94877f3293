"""The JUnit XML export (--junit): one testsuite per puzzle, one testcase per
checker with its source file and line, the whole failure in <failure> or
<error> and again in <system-out>."""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from .messages import first_line
from .puzzles import FAILING

XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(text):
    """Text XML 1.0 can hold: control characters (ANSI colours, stray bytes)
    become U+FFFD instead of making the whole report unreadable."""
    return XML_ILLEGAL.sub("\ufffd", text)


def write_junit(path, graded):
    """graded: [(chapter, flavor, puzzles)] as the tables show them."""
    root = ET.Element("testsuites", name="DTP puzzles")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for chapter, flavor, puzzles in graded:
        for p in puzzles:
            name = f"ch{chapter:02d} puzzle {p.id} {p.name}" if p.number else f"ch{chapter:02d} {p.name}"
            counts = {
                "tests": len(p.tests),
                "failures": p.count("failed"),
                "errors": p.count("error") + p.count("notrun"),
                "skipped": p.count("skipped"),
            }
            suite = ET.SubElement(root, "testsuite", name=name,
                                  time=f"{sum(t.seconds for t in p.tests):.3f}",
                                  **{k: str(v) for k, v in counts.items()})
            for k in totals:
                totals[k] += counts[k]
            for t in p.tests:
                where = {"file": t.file, "line": str(t.line)} if t.file else {}
                case = ET.SubElement(suite, "testcase", classname=f"ch{chapter:02d}.{t.suite}",
                                     name=t.name, time=f"{t.seconds:.3f}", **where)
                text = xml_text("\n\n".join(t.messages))
                if t.status == "failed":
                    ET.SubElement(case, "failure", message=xml_text(first_line(t.messages[0])),
                                  type="failure").text = text
                elif t.status in ("error", "notrun"):
                    message = xml_text(first_line(t.messages[0]) if t.messages else "not run")
                    ET.SubElement(case, "error", message=message, type="error").text = text
                elif t.status == "skipped":
                    ET.SubElement(case, "skipped")
                if t.status in FAILING:
                    # The whole message again as the test's output: GitLab and
                    # most JUnit viewers show <system-out>, some only that.
                    ET.SubElement(case, "system-out").text = text or "not run"
    for k, v in totals.items():
        root.set(k, str(v))
    tree = ET.ElementTree(root)
    ET.indent(tree)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)
