"""Settings for every test in the repository, core and plugins alike."""

import os

# Tests must never reach a model or dataset hub: fail fast instead of hanging on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# `make test` sets RLFACTORY_FORBID_SKIPS=1: there every dependency is installed, so a skip
# (e.g. `importorskip("vllm")` after a broken install) would hide a feature that no longer
# works. Only tests that need hardware this machine lacks (a CUDA GPU) may skip.
_HARDWARE_SKIP_WORDS = ("GPU", "CUDA")
_forbidden_skips: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    if not os.environ.get("RLFACTORY_FORBID_SKIPS") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(word in reason for word in _HARDWARE_SKIP_WORDS):
        _forbidden_skips.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter):
    if _forbidden_skips:
        terminalreporter.section("skips that RLFACTORY_FORBID_SKIPS turns into a failure", red=True)
        for nodeid, reason in _forbidden_skips:
            terminalreporter.line(f"{nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _forbidden_skips and exitstatus == 0:
        session.exitstatus = 1
