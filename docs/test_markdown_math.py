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

    def test_bold_and_quotes_around_formulas_for_doxygen(self):
        convert = markdown_math.convert
        self.assertEqual(convert("**scaled by $1/m$** and **plain**\n"),
                         "<b>scaled by \\f$1/m\\f$</b> and **plain**\n")
        self.assertEqual(convert("**over two\nlines $k$** x\n"), "<b>over two\nlines \\f$k\\f$</b> x\n")
        self.assertEqual(convert("**a\n\nb $k$** x\n"), "**a\n\nb \\f$k\\f$** x\n")
        self.assertEqual(convert('What "$\\Psi/N$" means, "plain"\n'),
                         'What \u201c\\f$\\Psi/N\\f$\u201d means, "plain"\n')
        self.assertEqual(convert("**`sp`**: x **`a` b** **c `d`**\n"),
                         "<b>`sp`</b>: x <b>`a` b</b> <b>c `d`</b>\n")
        source = '`"$x$"` and `**$y$**`\n```\n**$z$**\n```\n'
        self.assertEqual(convert(source), source)

    def test_line_count_is_kept(self):
        source = "a\n$$\nx\n$$\n![f](../../docs/figures/f.png)\n"
        self.assertEqual(markdown_math.convert(source).count("\n"), source.count("\n"))


if __name__ == "__main__":
    unittest.main()
