"""The DTP scoreboard that tools/grade.py runs, one idea per module:

cli            the command line: flags, argument errors (exit status 2), main()
grading        one run: build, run each chapter's checkers, print, export, exit status
repository     what the source tree says: chapters, their titles and puzzle suites
building       the build folder: building one chapter's checkers, finding the built ones
checker_run    running a checker binary under timeouts, again after a crash or a hang
gtest_output   reading GoogleTest's test listing, JSON report and console log
puzzles        a checker's result, a puzzle's verdict, grouping suites into puzzles
messages       the part of a GoogleTest failure a student should read
table          the scoreboard text: one table per chapter, wrapped, never cut
alike          failures alike but for rank and world size, shown once with where
junit          the JUnit XML export
gradescope     the Gradescope results.json export
output_files   checking early and writing the --junit/--gradescope files

Standard library only (plus tools/build_progress.py), so any python3 runs it.
"""
