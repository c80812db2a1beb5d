"""Settings for every test in the repository, core and plugins alike."""

import os

import pytest

# Tests must never reach a model or dataset hub: fail fast instead of hanging on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# The untrained model's evals that runs keep for reuse (rlfactory_core.eval_reuse) go to a
# directory of this test session, not the user's $RLFACTORY_HOME/evals: no test reads an
# eval that an earlier session (other code, another model build) kept.
if "RLFACTORY_EVAL_CACHE" not in os.environ:  # (pytest-xdist's workers inherit the controller's)
    import atexit
    import shutil
    import tempfile

    os.environ["RLFACTORY_EVAL_CACHE"] = tempfile.mkdtemp(prefix="rlfactory-test-evals-")
    atexit.register(shutil.rmtree, os.environ["RLFACTORY_EVAL_CACHE"], ignore_errors=True)


# `make test` sets RLFACTORY_FORBID_SKIPS=1: there every dependency is installed, so a skip
# (e.g. `importorskip("vllm")` after a broken install) would hide a feature that no longer
# works. Only tests that need hardware this machine lacks (a CUDA GPU) may skip.
_HARDWARE_SKIP_WORDS = ("GPU", "CUDA")
_forbidden_skips: list[tuple[str, str]] = []


def _is_xdist_worker(config) -> bool:
    """A pytest-xdist worker (``make test TEST_WORKERS=N``): it sees only its share of the suite, so
    the whole-suite checks here run in the controller, from the reports and outputs it gets."""
    return hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    if not os.environ.get("RLFACTORY_FORBID_SKIPS") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(word in reason for word in _HARDWARE_SKIP_WORDS):
        _forbidden_skips.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter):
    _report_hook_coverage(terminalreporter)
    if _forbidden_skips:
        terminalreporter.section("skips that RLFACTORY_FORBID_SKIPS turns into a failure", red=True)
        for nodeid, reason in _forbidden_skips:
            terminalreporter.line(f"{nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _is_xdist_worker(session.config):
        # the controller checks skips from the reports it gets; it needs the hooks called here
        session.config.workeroutput[_HOOKS_CALLED_KEY] = sorted(_hook_calls.called) if _hook_calls else []
        return
    if _forbidden_skips and exitstatus == 0:
        session.exitstatus = 1
    _check_hook_coverage(session, session.exitstatus)


# `make test TEST_WORKERS=N` runs the suite on N pytest-xdist workers with ``--dist loadfile``,
# refined here (pytest_xdist_make_scheduler): every file is sent whole to one worker (its module fixtures,
# a Ray cluster or a vLLM engine, start once), and EXCLUSIVE_FILES form one unit, run one file
# after another on one worker while the other worker takes the remaining files one at a time.
# Their tests start vLLM engines and Ray clusters or train the 135M model: two of those at once
# on CI's 2 cores and 23 GB spin against each other (a 4-minute test took 13) and run the node
# out of memory (bench/README.md "make test"). They go first, the longest first, so that the
# light files fill in beside them. A new file that starts an engine or a cluster belongs here.
# On 2 cores it saved 7 % over one process (the default) and vLLM's threads, spinning on both
# cores, starved the other worker into a timeout.
# (Not xdist's ``loadgroup``: under pytest 9.2 its group marks are lost, pytest-xdist #1386.)
EXCLUSIVE_FILES = (
    "tests/test_ray_engine.py",
    "tests/test_ray_stop.py",
    "tests/test_learning.py",
    "tests/test_vllm_backend.py",
    "tests/test_async_mode.py",
    "plugins/rlfactory-plugin-android/tests/test_android_screenshots.py",
    "tests/test_models.py",
    "plugins/rlfactory-plugin-qwq-judge/tests/test_qwq_judge_local.py",
    "tests/test_vision_vllm.py",
)
_ROOT = os.path.dirname(os.path.abspath(__file__))
for _path in EXCLUSIVE_FILES:  # a renamed file would silently lose its place
    assert os.path.isfile(os.path.join(_ROOT, _path)), f"conftest.py EXCLUSIVE_FILES: {_path} is gone; update it"


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(EXCLUSIVE_FILES)}

    def file_rank(item):
        return rank.get(os.path.relpath(str(item.path), _ROOT).replace(os.sep, "/"), len(rank))

    items.sort(key=file_rank)  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's controller: ``--dist loadfile`` with EXCLUSIVE_FILES as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class EnginesOneAtATime(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)  # the file, relative to the rootdir
            return "engines: " + ", ".join(EXCLUSIVE_FILES) if path in EXCLUSIVE_FILES else path

    return EnginesOneAtATime(config, log)


# Every hook must be proven called by some test: pluggy's hook-call monitoring records the
# hooks that reached an implementation on every plugin manager the core builds in this
# process, and a session that ran the whole suite fails when a hookspec was never called.
# Only the whole suite can prove that (a run of one file calls few hooks), so the check runs
# when pytest collected its testpaths (`make test`, bare `pytest`) with nothing deselected;
# RLFACTORY_HOOK_COVERAGE=1 forces it on a partial run, =0 turns it off.
HOOK_COVERAGE_ENV = "RLFACTORY_HOOK_COVERAGE"
_hook_calls = None
_deselected = []
_never_called: list[str] = []
_HOOKS_CALLED_KEY = "rlfactory_hooks_called"


def pytest_configure(config):
    global _hook_calls
    from rlfactory_core.testing import HookCallRecorder

    _hook_calls = HookCallRecorder()
    _hook_calls.start()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker finished; add the hooks its tests called."""
    if _hook_calls is not None:
        _hook_calls.called.update(getattr(node, "workeroutput", {}).get(_HOOKS_CALLED_KEY, []))


def pytest_deselected(items):
    _deselected.extend(items)


def _whole_suite_ran(session) -> bool:
    forced = os.environ.get(HOOK_COVERAGE_ENV, "").strip()
    if forced in {"0", "1"}:
        return forced == "1"
    option = session.config.option
    return (session.config.args_source == pytest.Config.ArgsSource.TESTPATHS and not _deselected
            and not option.keyword and not option.markexpr and not getattr(option, "lf", False)
            and not option.collectonly and session.testscollected > 0)


def _check_hook_coverage(session, exitstatus):
    if exitstatus != 0 or _hook_calls is None or not _whole_suite_ran(session):
        return
    _never_called.extend(_hook_calls.never_called())
    if _never_called:
        session.exitstatus = 1


def _report_hook_coverage(terminalreporter):
    if _never_called:
        terminalreporter.section("hooks no test called (root conftest.py: hook coverage)", red=True)
        for hook in _never_called:
            terminalreporter.line(f"{hook}: no test called it through the plugin manager; write one that does "
                                  f"(a test plugin implementing it, and the code path that calls it)")


# --------------------------------------------------------------------------- models
# Here rather than in tests/conftest.py: pytest applies a conftest to the tests below it, and
# the plugins' tests need the same models (one conversion, one tiny model per session).


@pytest.fixture(scope="session")
def default_model_dir():
    """The embedded default model converted to an HF directory (shared cache, converted once)."""
    from rlfactory_core.models import DEFAULT_MODEL, prepare_model

    return prepare_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir):
    """A 3-layer Llama with the default model's tokenizer (real chat template, real ids);
    random weights: it never makes a tool call and answers nothing right. For a run's
    mechanics (training, resuming, an env's servers and files) in seconds."""
    from rlfactory_core.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), default_model_dir)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory, default_model_dir):
    """A tiny random LLaVA (2-layer Llama + 1-layer CLIP, 4 image tokens per image) with the
    default model's tokenizer and a processor: the image path's mechanics, end to end."""
    from rlfactory_core.testing import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vlm"), default_model_dir)
