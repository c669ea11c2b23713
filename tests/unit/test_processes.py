"""Saved processes are found again by PID and start time, before exec, after exec, never after exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fleetpilot.devcluster import processes

# A child that stays in Python for a while and only then execs `sleep`: the window in which a
# command-line check would call it dead, made wide on purpose.
SLOW_EXEC = "import os, time; time.sleep(0.5); os.execvp('sleep', ['sleep', '30'])"


def _wait_for_exec(pid: int) -> None:
    for _ in range(200):
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"):
            return
        time.sleep(0.05)
    raise AssertionError("the child never exec'd sleep")


def test_a_child_is_alive_before_and_after_it_execs(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", SLOW_EXEC], start_new_session=True)
    try:
        record = tmp_path / "child.pid"
        processes.record(record, child.pid)
        assert processes.alive(record) == child.pid  # still Python: its command line is not `sleep` yet
        _wait_for_exec(child.pid)
        assert processes.alive(record) == child.pid
    finally:
        processes.terminate_group(child.pid, timeout=5)
        child.wait(timeout=5)
    assert processes.alive(record) is None


def test_an_exited_child_is_not_alive_even_as_an_unreaped_zombie(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = tmp_path / "child.pid"
    processes.record(record, child.pid)
    for _ in range(200):
        if processes.is_stopped(child.pid):
            break
        time.sleep(0.05)
    assert processes.alive(record) is None  # a zombie until waited for: not running
    child.wait(timeout=5)
    assert processes.alive(record) is None


def test_a_record_naming_another_process_with_that_pid_is_not_alive(tmp_path: Path) -> None:
    """PID reuse: the PID runs, but it started at another time than the one we saved."""
    record = tmp_path / "reused.pid"

    started = processes.start_time(os.getpid())
    assert started is not None
    record.write_text(f"{os.getpid()} {started + 1}\n")
    assert processes.alive(record) is None
    record.write_text(f"{os.getpid()} {started}\n")
    assert processes.alive(record) == os.getpid()


def test_missing_or_old_format_records_are_not_alive(tmp_path: Path) -> None:
    assert processes.alive(tmp_path / "absent.pid") is None
    old = tmp_path / "old.pid"
    old.write_text("1\n/usr/bin/etcd\n")  # the format before start times were saved
    assert processes.alive(old) is None
