// Appended by Doxygen (MATHJAX_CODEFILE) after its own MathJax 2 configuration
// when the docs use the MathJax copied into html/mathjax (docs/CMakeLists.txt).
// Only the TeX fonts are copied, so MathJax must not look for others (a machine
// with STIX fonts installed would otherwise ask for metrics that are not there),
// and there are no image fonts to fall back to. The AMS macros (\tfrac, \lVert,
// ...) are loaded up front as MathJax 3 (the CDN fallback) does.
MathJax.Hub.Config({
  TeX: { extensions: ["AMSmath.js", "AMSsymbols.js"] },
  "HTML-CSS": { availableFonts: ["TeX"], preferredFont: "TeX", webFont: "TeX", imageFont: null },
  messageStyle: "none"
});
