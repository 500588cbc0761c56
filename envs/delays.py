"""Heterogeneity knobs shared by every backend: emulate slow workers and random stalls."""

from __future__ import annotations

import time

import numpy as np

__all__ = ["Delays"]


class Delays:
    """Extra waiting added to steps and resets, all off by default.

    ``slowdown``: every step/reset takes ``slowdown`` times its real duration (a slower node).
    ``step_delay_s`` / ``step_delay_prob``: with that probability per vector step, the whole
    step stalls ``step_delay_s`` seconds (a straggler hiccup). ``reset_delay_s``: extra seconds
    per episode reset (slow scene loading). ``seed`` fixes the random stalls.
    """

    def __init__(self, *, slowdown=1.0, step_delay_s=0.0, step_delay_prob=0.0, reset_delay_s=0.0,
                 seed=0):
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown multiplies step cost and must be >= 1, got {slowdown!r}")
        if not (step_delay_s >= 0 and reset_delay_s >= 0 and 0.0 <= step_delay_prob <= 1.0):
            raise ValueError("step_delay_s and reset_delay_s must be >= 0 and step_delay_prob "
                             "in [0, 1]")
        self.slowdown = float(slowdown)
        self.step_delay_s = float(step_delay_s)
        self.step_delay_prob = float(step_delay_prob)
        self.reset_delay_s = float(reset_delay_s)
        self.reseed(seed)

    def reseed(self, seed):
        """Restart the stall stream from ``seed``."""
        self._rng = np.random.default_rng([0 if seed is None else int(seed), 7919])

    @property
    def active(self):
        """Whether any knob is on."""
        return (self.slowdown > 1.0 or self.reset_delay_s > 0
                or (self.step_delay_s > 0 and self.step_delay_prob > 0))

    def wait(self, elapsed, *, resets=0, step=True):
        """Sleep as configured after work that took ``elapsed`` seconds and did ``resets``."""
        if not self.active:
            return
        pause = (self.slowdown - 1.0) * elapsed + self.reset_delay_s * resets
        if step and self.step_delay_prob > 0 and self._rng.random() < self.step_delay_prob:
            pause += self.step_delay_s
        if pause > 0:
            time.sleep(pause)
