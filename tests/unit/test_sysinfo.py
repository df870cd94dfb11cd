"""Machine facts from /proc agree with psutil's, and parse the shapes /proc takes."""

from __future__ import annotations

import sys

import psutil
import pytest

from llmrun.sysinfo import available_memory, default_threads, meminfo_available, physical_cores

CPUINFO = """processor\t: 0
physical id\t: 0
core id\t\t: 0

processor\t: 1
physical id\t: 0
core id\t\t: 0

processor\t: 2
physical id\t: 0
core id\t\t: 1

processor\t: 3
physical id\t: 1
core id\t\t: 0
"""


def test_physical_cores_count_distinct_cores_of_each_package() -> None:
    assert physical_cores(CPUINFO) == 3  # two hyperthreads share core 0 of package 0
    assert physical_cores("processor : 0\nBogoMIPS : 50\n\nprocessor : 1\n") is None  # ARM: no core ids
    assert physical_cores(None) is None


def test_meminfo_gives_what_is_available_in_bytes() -> None:
    assert meminfo_available("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2048 * 1024
    assert meminfo_available("MemTotal: 100 kB\n") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_this_machine_agrees_with_psutil() -> None:
    assert default_threads() == (psutil.cpu_count(logical=False) or psutil.cpu_count())
    assert abs(available_memory() - psutil.virtual_memory().available) < 256 * 1024 * 1024
