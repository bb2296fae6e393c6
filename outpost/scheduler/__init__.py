"""Pure continuous-batching scheduler: request states, slots, prefix reuse, budgets, finishes.

No I/O and no llama.cpp here; `output.py` is the contract with the runner that does the work.
"""

from outpost.scheduler.config import SchedulerConfig
from outpost.scheduler.scheduler import Scheduler
from outpost.scheduler.textstream import TextStream

__all__ = ["Scheduler", "SchedulerConfig", "TextStream"]
