"""What the checks of the built programs share: failures are collected, not
raised, so one run reports every broken expectation, each with the command
and what the program did."""

FAILURES = []


def expect(condition, message):
    """Records @p message as a failure when @p condition is false; returns it."""
    if not condition:
        FAILURES.append(message)
    return condition


def show(result):
    """The exit status and the ends of stdout and stderr of a finished run."""
    return (f"exit {result.returncode}\n--- stdout (end) ---\n{result.stdout[-1500:]}"
            f"\n--- stderr (end) ---\n{result.stderr[-1500:]}")


def report(name):
    """Prints every failure, then a one-line verdict; the exit status to return."""
    for failure in FAILURES:
        print("FAILED:", failure, "\n")
    print(f"{name}: {'passed' if not FAILURES else f'{len(FAILURES)} failure(s)'}")
    return 1 if FAILURES else 0
