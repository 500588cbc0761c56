"""Reading a run's log.txt in tests: the launches of a run (a first start, resumes, relaunches of
the elastic supervisor), their lines' times and the exact counters they must add up to."""
from __future__ import annotations

import re
import time


def stamp(line: str) -> float:
    """Seconds since the epoch of a log.txt line's ``[YYYY-MM-DD HH:MM:SS]`` (local time)."""
    return time.mktime(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S"))


def launches(log: str) -> list[dict]:
    """Each launch of the run as log.txt tells it: world size, where it started (update, frames)
    and where it ended (its last progress line's update and frames); a shrink in place starts one
    (``"in_place"``: its frames since the last count are checked by the in-place tests)."""
    out: list[dict] = []
    for line in log.splitlines():
        if m := re.search(r"resumed from \S+: update (\d+), frames (\d+)", line):
            start = (int(m.group(1)), int(m.group(2)))
            out.append({"world": None, "start": start, "end": start})
        elif m := re.search(r"training \w+ on (\d+) ranks?\b", line):
            if out and out[-1]["world"] is None:  # "resumed" comes first within a launch
                out[-1]["world"] = int(m.group(1))
            else:
                out.append({"world": int(m.group(1)), "start": (0, 0), "end": (0, 0)})
        elif m := re.search(r"continuing in place on (\d+) ranks? from update (\d+) \((\d+) "
                            r"frames\)", line):
            # (Open MPI's survivors shrank: a launch of its own within the processes, from the
            # lowest survivor's update, which may be past the last progress line)
            start = (int(m.group(2)), int(m.group(3)))
            out.append({"world": int(m.group(1)), "start": start, "end": start, "in_place": True})
        elif m := re.search(r"update=(\d+) frames=(\d+)", line):
            out[-1]["end"] = (int(m.group(1)), int(m.group(2)))
    return out


def assert_counters_exact(log: str, *, step_frames: int, total: int) -> list[dict]:
    """Each launch goes on from a synchronised state of the one before (never past its last
    progress line: nothing counted twice), adds ``step_frames`` x its world size per update (full
    lock-step rollouts), and the last one ends at the first update that reaches ``total``."""
    runs = launches(log)
    for item in runs:
        (u0, f0), (u1, f1) = item["start"], item["end"]
        assert f1 - f0 == (u1 - u0) * step_frames * item["world"], (item, log[-3000:])
    for before, after in zip(runs, runs[1:]):
        assert after.get("in_place") or after["start"][0] <= before["end"][0], runs
    last = runs[-1]
    assert last["end"][1] >= total > last["end"][1] - step_frames * last["world"], runs
    return runs
