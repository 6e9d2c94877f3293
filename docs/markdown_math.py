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

Doxygen 1.9 also leaves a formula raw (\\f$x\\f$ on the page) inside "double
quotes", and does not make **bold text with a formula** bold; so around a
formula, "..." becomes “...” and **...** becomes <b>...</b> (also
**`code`**, which Doxygen does not make bold either).
Standard library only.
"""
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
# A picture link into docs/figures: ![alt](../../docs/figures/name.png).
FIGURE = re.compile(r"(!\[[^\]]*\]\()(?:\.\./)*docs/figures/([^)\s]+\))")
# Inline math: $ then a non-blank, up to a non-blank then $ not followed by a digit.
INLINE = re.compile(r"(?<![\\$])\$(?=\S)(.+?)(?<=\S)(?<!\\)\$(?![\d$])")
CODE_SPAN = re.compile(r"`+[^`\n]*`+")
# **bold** within one paragraph, and "a quote" within one line.
BOLD = re.compile(r"\*\*(?=\S)((?:(?!\n[ \t]*\n)[^*])+?)(?<=\S)\*\*")
QUOTE = re.compile(r'"([^"\n]+)"')


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


def has_formula(text):
    return "\\f$" in text or "\\f[" in text


def needs_tag(bold):
    """Bold that Doxygen leaves as **...**: with a formula, or starting or
    ending with a code span (\\0k\\0 here), e.g. **`sp`**."""
    return has_formula(bold) or bold.startswith("\0") or bold.endswith("\0")


def doxygen_quirks(text):
    """Bold and quotes around formulas, in converted text outside fences
    (several lines: bold may span them); code spans are left alone."""
    spans = []

    def keep(match):
        spans.append(match.group(0))
        return "\0%d\0" % (len(spans) - 1)

    text = CODE_SPAN.sub(keep, text)
    text = BOLD.sub(lambda m: "<b>" + m.group(1) + "</b>" if needs_tag(m.group(1)) else m.group(0), text)
    text = QUOTE.sub(lambda m: "\u201c" + m.group(1) + "\u201d" if has_formula(m.group(1)) else m.group(0), text)
    return re.sub("\0(\\d+)\0", lambda m: spans[int(m.group(1))], text)


def convert(source):
    """The whole file: math and figures line by line, then Doxygen's quirks
    on each stretch of text between fenced code blocks."""
    out, prose = [], []
    for piece, is_code in convert_pieces(source):
        if is_code:
            out.append(doxygen_quirks("".join(prose)))
            prose = []
            out.append(piece)
        else:
            prose.append(piece)
    out.append(doxygen_quirks("".join(prose)))
    return "".join(out)


def convert_pieces(source):
    """(text, is_code) pieces of the converted file, in order."""
    out, in_fence, display = [], False, None
    for line in source.splitlines(keepends=True):
        if display is not None:  # inside a $$ block spanning lines
            display.append(line)
            if "$$" in line:
                out.append((convert_text("".join(display)), False))
                display = None
            continue
        if FENCE.match(line):
            in_fence = not in_fence
            out.append((line, True))
            continue
        if in_fence:
            out.append((line, True))
            continue
        if line.count("$$") % 2 == 1:
            display = [line]
            continue
        out.append((convert_line(line), False))
    if display is not None:
        out.append(("".join(display), False))
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        text = convert(f.read())
    sys.stdout.buffer.write(text.encode("utf-8"))


if __name__ == "__main__":
    main()
