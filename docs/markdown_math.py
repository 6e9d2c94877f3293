#!/usr/bin/env python3
"""Doxygen input filter: GitHub-style math in Markdown to Doxygen formulas.

It also turns a lesson's picture links into docs/figures (written relative
to the lesson, e.g. ../../docs/figures/x.png, so GitHub shows them) into the
bare file name, which Doxygen finds on its IMAGE_PATH and copies into the
HTML folder.

The lessons are written for GitHub, where $x$ is inline math and $$x$$ is a
display formula. Doxygen 1.9 wants \\f$x\\f$ and \\f[x\\f] instead. This filter
rewrites one file to stdout, leaving fenced code blocks, `code spans` and \\$
alone, and never adds or removes a line (so warnings keep their line numbers).
Standard library only.
"""
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
# A picture link into docs/figures: ![alt](../../docs/figures/name.png).
FIGURE = re.compile(r"(!\[[^\]]*\]\()(?:\.\./)*docs/figures/([^)\s]+\))")
# Inline math: $ then a non-blank, up to a non-blank then $ not followed by a digit.
INLINE = re.compile(r"(?<![\\$])\$(?=\S)(.+?)(?<=\S)(?<!\\)\$(?![\d$])")


def convert_text(text):
    """Rewrites text that holds no code: $$..$$ first, then figure links, then $..$."""
    text = re.sub(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$", lambda m: "\\f[" + m.group(1) + "\\f]",
                  text, flags=re.S)
    text = FIGURE.sub(lambda m: m.group(1) + m.group(2), text)
    return INLINE.sub(lambda m: "\\f$" + m.group(1) + "\\f$", text)


def convert_line(line):
    """Converts the parts of a line that are outside `code spans`."""
    parts = re.split(r"(`+[^`]*`+)", line)
    return "".join(p if p.startswith("`") else convert_text(p) for p in parts)


def convert(source):
    out, in_fence, display = [], False, None
    for line in source.splitlines(keepends=True):
        if display is not None:  # inside a $$ block spanning lines
            display.append(line)
            if "$$" in line:
                out.append(convert_text("".join(display)))
                display = None
            continue
        if FENCE.match(line):
            in_fence = not in_fence
            out.append(line)
            continue
        if in_fence:
            out.append(line)
            continue
        if line.count("$$") % 2 == 1:
            display = [line]
            continue
        out.append(convert_line(line))
    if display is not None:
        out.append("".join(display))
    return "".join(out)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(convert(f.read()))


if __name__ == "__main__":
    main()
