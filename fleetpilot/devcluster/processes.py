"""Processes we started, found again by a saved PID and the kernel's start time.

A PID alone is reused once its process exits, and the command line is no identity either: between
fork and exec it is still the parent's, so a check made right after `Popen` under load can call a
healthy child dead. The start time (field 22 of /proc/PID/stat, clock ticks since boot) is fixed at
fork and never changes, so the pair (PID, start time) names exactly one process for as long as it
lives, before and after exec.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None  # field 22; the list starts at field 3


def is_stopped(pid: int) -> bool:
    """Gone, or a zombie nobody reaps: either way it no longer runs."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] == "Z"


def record(path: Path, pid: int) -> None:
    """Save who `pid` is, so another process (or a later run) can find it again."""
    path.write_text(f"{pid} {start_time(pid)}\n")


def alive(path: Path) -> int | None:
    """The PID saved at `path` while that very process still runs; None otherwise."""
    try:
        words = path.read_text().split()
        pid, started = int(words[0]), int(words[1])
    except (OSError, IndexError, ValueError):  # missing, or written by an older version
        return None
    if start_time(pid) != started or is_stopped(pid):
        return None
    return pid


def terminate_group(pid: int, *, timeout: float) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `timeout`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if is_stopped(pid):
                return
            time.sleep(0.1)
