"""What every plot script shares: reading the benchmarks' JSON lines, where
figures go, keeping one setup per figure, and the footer naming the run."""

import json
import os
import sys


def read_rows(paths):
    """Every JSON object in the JSON-lines files @p paths, in order; a line
    that is not JSON stops the script naming its file and line."""
    rows = []
    for path in paths:
        with open(path) as lines:
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    sys.exit(f"{path}:{number}: not JSON: {error}")
    return rows


def figure_folder(out=None):
    """@p out, or docs/figures of this repository; created if missing."""
    folder = out or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "figures")
    os.makedirs(folder, exist_ok=True)
    return folder


def keep_last_setup(rows, setup_key, script, what="line(s)"):
    """The rows of the last row's setup: one figure per setup would need more
    names. Says on stderr how many rows of another setup were left out."""
    setup = setup_key(rows[-1])
    kept = [r for r in rows if setup_key(r) == setup]
    if len(kept) < len(rows):
        print(f"{script}: skipped {len(rows) - len(kept)} {what} of another setup (model, optimizer, backend or "
              f"device) than the last line's", file=sys.stderr)
    return kept


def provenance(rows):
    """"2026-11-23 · git abc1234, def5678": every date and every revision the
    rows came from (a figure may merge files of several runs)."""
    revisions = sorted({r.get("git", "unknown") for r in rows})
    dates = sorted({r.get("date", "")[:10] for r in rows if r.get("date")})
    return f"{', '.join(dates)} · git {', '.join(revisions)}"


def run_footer(rows, program, what=None):
    """A figure's footer: the benchmark (and which of its parts), the
    backend, device, cores and CPU of the last row, then provenance()."""
    r = rows[-1]
    cpu = f", {r['cpu']}" if r.get("cpu") else ""
    part = f" ({what})" if what else ""
    return (f"{program}{part} · {r.get('backend')}/{r.get('device')}, {r.get('cores', '?')} cores{cpu} · "
            f"{provenance(rows)}")
