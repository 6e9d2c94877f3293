"""Failures that say the same thing: a checker that runs on world sizes 1 to 8
and fails on every rank repeats one mistake many times, differing only in
where it happened (the rank, the world size, gtest's file:line) and in the
values it found there. --puzzle and -v show each distinct failure once, with
the places it occurred; --every-failure shows them all."""

import re
from dataclasses import dataclass, field

from .messages import full_message

# The parts of a message that say where it happened. Each match is replaced
# by a placeholder; the number is kept under its label ("N", "rank",
# "TP rank", "--sp") to say where the failure occurred.
WHERE_RE = re.compile(
    r"\bon N ?= ?(?P<n_eq>\d+)"  # "ring_all_reduce on N=4"
    r"|\b(?P<n_ranks>\d+) rank(?:s\b|\(s\))"  # "on 4 rank(s)", "all 4 ranks"
    r"|\bon (?P<n_on>\d+) rank\b"  # "on 1 rank"
    r"|\bworld (?:size |of )(?P<n_world>\d+)"  # "world size 3", "a world of 3"
    r"|--world[ =](?P<n_flag>\d+)"  # "--world 4"
    r"|(?P<flag>--(?:tp|dp|pp|sp))[ =](?P<flag_value>\d+)"  # "--sp 2"
    r"|\b(?P<group>(?:world|TP|DP|PP|SP|EP) )?rank (?P<rank>\d+)\b")  # "rank 1", "TP rank 0"

# gtest's SCOPED_TRACE lines ("path/x_test.cpp:40: world size 3") lose their file:line.
TRACE_LOCATION_RE = re.compile(r"(?m)^(\s*)\S+:\d+: ")


def where_of(text):
    """(the message with its where-parts replaced, {label: set of numbers})."""
    places = {}

    def replace(m):
        kind = m.lastgroup
        if kind == "rank":
            label, value = (m.group("group") or "") + "rank", m.group("rank")
        elif kind == "flag_value":
            label, value = m.group("flag"), m.group("flag_value")
        else:
            label, value = "N", m.group(kind)
        places.setdefault(label, set()).add(int(value))
        return m.group(0).replace(value, "#")

    trace = text.find("Google Test trace:")
    if trace >= 0:
        text = text[:trace] + TRACE_LOCATION_RE.sub(r"\1", text[trace:])
    key = WHERE_RE.sub(replace, text)
    return re.sub(r"\s+", " ", key).strip(), places


def number_list(values, ranges):
    """[0, 1, 2, 3, 6] as "0-3, 6" (ranges) or "0, 1, 2, 3, 6"."""
    values = sorted(values)
    if not ranges:
        return ", ".join(str(v) for v in values)
    parts, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            run = values[start:i]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)))
            start = i
    return ", ".join(parts)


# A number in a message (a value, a position, a count), for failures that
# differ only in their numbers.
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass
class Alike:
    """One distinct failure: its first occurrence in full, and where it occurred."""
    message: str  # the first occurrence, as full_message() gives it
    checkers: list = field(default_factory=list)  # TestResults, in order, each once
    count: int = 0  # how many failures it stands for
    places: dict = field(default_factory=dict)  # label: set of numbers
    texts: set = field(default_factory=set)  # the failures' texts without their where-parts

    def where(self):
        """"on N=2, 3, 4; ranks 0-3" (empty when nothing says where). A flag
        that took the same values as N ("--sp 2 on 2 rank(s)") adds nothing."""
        parts = []
        world = self.places.get("N")
        if world:
            parts.append("on N=" + number_list(world, ranges=False))
        for label in sorted(self.places):
            values = self.places[label]
            if label.startswith("--"):
                if values != world:
                    parts.append(f"{label} {number_list(values, ranges=False)}")
            elif label != "N":
                plural = "s" if len(values) > 1 else ""
                parts.append(f"{label}{plural} {number_list(values, ranges=True)}")
        return "; ".join(parts)

    def summary(self):
        """What the first occurrence stands for, or "" when it is alone:
        "(12 times alike: on N=2, 3, 4; ranks 0-3; the first in full:)"."""
        if self.count == 1:
            return ""
        where = self.where()
        alike = "alike" if len(self.texts) == 1 else \
            "alike but for their numbers (values, positions, counts)"
        return f"({self.count} times {alike}{': ' + where if where else ''}; the first in full:)"


def group_alike(tests, numbers=True):
    """The distinct failures of these failing checkers (TestResults), in the
    order they first occur. Two failures are alike when their text is the same
    once rank, world size and gtest's file:line are taken out, and (with
    `numbers`) their other numbers too: the same check failing with other
    values at other positions."""
    groups = {}
    for test in tests:
        for raw in test.messages or ["not run"]:
            message = full_message(raw)
            text, places = where_of(message)
            key = NUMBER_RE.sub("#", text) if numbers else text
            group = groups.get(key)
            if group is None:
                group = groups[key] = Alike(message)
            group.count += 1
            group.texts.add(text)
            if not any(checker is test for checker in group.checkers):
                group.checkers.append(test)
            for label, values in places.items():
                group.places.setdefault(label, set()).update(values)
    return list(groups.values())
