#!/usr/bin/env python3
"""Checks of the Doxygen input filter (markdown_math.py): math, figure links,
code left alone, and the line count kept."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import markdown_math  # noqa: E402


class MarkdownMath(unittest.TestCase):
    def test_inline_and_display_math(self):
        self.assertEqual(markdown_math.convert("a $x^2$ b\n"), "a \\f$x^2\\f$ b\n")
        self.assertEqual(markdown_math.convert("$$ y $$\n"), "\\f[ y \\f]\n")
        self.assertEqual(markdown_math.convert("costs $5 and $6\n"), "costs $5 and $6\n")

    def test_figure_links_become_bare_names_for_the_image_path(self):
        self.assertEqual(markdown_math.convert("![Memory](../../docs/figures/zero_memory.png)\n"),
                         "![Memory](zero_memory.png)\n")
        self.assertEqual(markdown_math.convert("![a](docs/figures/b.png) ![c](other/d.png)\n"),
                         "![a](b.png) ![c](other/d.png)\n")

    def test_code_is_left_alone(self):
        source = "`$x$ ![a](../docs/figures/b.png)`\n```\n$y$\n```\n"
        self.assertEqual(markdown_math.convert(source), source)

    def test_line_count_is_kept(self):
        source = "a\n$$\nx\n$$\n![f](../../docs/figures/f.png)\n"
        self.assertEqual(markdown_math.convert(source).count("\n"), source.count("\n"))


if __name__ == "__main__":
    unittest.main()
