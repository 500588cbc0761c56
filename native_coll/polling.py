"""The one way this project waits for MPI from Python: poll, then sleep with a back-off.

MPICH moves a message only inside MPI calls, so a rank waiting for its peers must keep calling in;
a blocking call would spin a core at 100% (the ranks oversubscribe the cores) and could not be
bounded. :func:`poll_until` polls without sleeping for a short spin (data that is already moving
completes within it), then sleeps between polls with a pause that doubles from 50 us to 5 ms, so a
rank that waits minutes for a straggler costs well under 1% of a core and still reacts within 5 ms.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional, TypeVar

__all__ = ["poll_until", "FIRST_SLEEP_S", "MAX_SLEEP_S"]

FIRST_SLEEP_S, MAX_SLEEP_S = 50e-6, 5e-3

T = TypeVar("T")


def poll_until(test: Callable[[], Optional[T]], *, deadline: float, spin_s: float = 0.0,
               before_sleep: Callable[[], None] | None = None) -> Optional[T]:
    """Call ``test()`` until it returns something other than None/False and return that, or
    return None once ``time.monotonic()`` passes ``deadline``.

    For the first ``spin_s`` seconds the loop only yields the core between polls; after that it
    sleeps with the back-off, calling ``before_sleep()`` (e.g. to look for a peer's failure
    notice, which may raise) before each sleep.
    """
    pause = FIRST_SLEEP_S
    spin_until = time.monotonic() + spin_s
    while True:
        got = test()
        if got is not None and got is not False:
            return got
        now = time.monotonic()
        if now >= deadline:
            return None
        if now < spin_until:
            os.sched_yield()
            continue
        if before_sleep is not None:
            before_sleep()
        time.sleep(pause)
        pause = min(2 * pause, MAX_SLEEP_S)
