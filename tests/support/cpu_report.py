"""Each test's CPU, and the heaviest at the end of the run (a pytest plugin, tests/conftest.py).

The suite's budget is CPU on a 2-core box as much as wall: two workers side by side (pytest-xdist)
share the cores, so a test that waits on a single-threaded child and one that keeps both cores
busy can show the same wall. Each phase of a test (setup, call, teardown: a session fixture's
cost lands on the first test that asks for it, as in ``--durations``) is measured as this
process's user + system time and its waited-for children's (``getrusage``: every compiler, qola
run and generator a test starts and waits for; a server left running counts only when it exits).
The figure travels with the test's report (``user_properties``, so across xdist's workers), and
the end of the run lists the :data:`SHOWN` tests with the most CPU and the run's total.
"""

from __future__ import annotations

import resource
from collections.abc import Generator

import pytest

SHOWN = 20
KEY = "cpu_s"  # a report's user property: one phase's CPU seconds


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _measured(item: pytest.Item) -> Generator[None, None, None]:
    start = _cpu()
    yield
    item.user_properties.append((KEY, round(_cpu() - start, 3)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    yield from _measured(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield from _measured(item)


class Tally:
    """The CPU and wall of each test, as its reports arrive (on the controller under xdist)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.wall[report.nodeid] = self.wall.get(report.nodeid, 0.0) + report.duration
        if report.when == "teardown":  # its properties by then: one figure per phase that ran
            self.cpu[report.nodeid] = sum(v for k, v in report.user_properties if k == KEY and isinstance(v, float))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.cpu:
            return
        total = sum(self.cpu.values())
        terminalreporter.write_sep("=", f"the {SHOWN} tests with the most CPU (all {len(self.cpu)}: {total:.0f} s)")
        for nodeid, cpu in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:SHOWN]:
            terminalreporter.write_line(f"{cpu:8.1f} s CPU {self.wall.get(nodeid, 0.0):8.1f} s wall  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) tallies
        config.pluginmanager.register(Tally(), "qola-cpu-tally")
