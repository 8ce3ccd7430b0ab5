"""pytest plugin: the fixture ``deltaproof_check`` and the options that steer it.

An installed deltaproof registers it (entry point pytest11); from a build tree load it with
``pytest -p deltaproof.pytest_plugin``.

    def test_my_kernel(deltaproof_check):
        deltaproof_check(my_kernel, op="gated-delta", dtypes=("bf16",), max_cases=16)

deltaproof_check(fn, op=..., **check_kernel_args) runs deltaproof.testing.assert_kernel_agrees and
returns the Report. It prints nothing while cases agree; a failure's message is the shrunk case and
its verdict table, with the seed and the pytest option that reproduces the run.

  --deltaproof-seed=N|random  seed of every check (default: the test's own, else 0); "random" draws
                              one for the session and prints it in the header
  --deltaproof-max-cases=N    cases per check, overriding the test's max_cases
  --deltaproof-log            one line per case (shown with -s)
"""
import os

import pytest

from .testing import assert_kernel_agrees


def pytest_addoption(parser):
    group = parser.getgroup("deltaproof", "deltaproof: kernels against the exact oracle")
    group.addoption("--deltaproof-seed", default=None, metavar="N|random",
                    help="seed of check_kernel's draws for every deltaproof_check (overrides the test's seed; "
                         "'random' draws one for the session)")
    group.addoption("--deltaproof-max-cases", type=int, default=None, metavar="N",
                    help="cases per deltaproof_check (overrides the test's max_cases)")
    group.addoption("--deltaproof-log", action="store_true", default=False,
                    help="print one line per case (visible with -s)")


def pytest_configure(config):
    value = config.getoption("deltaproof_seed", None)
    if value is None:
        seed = None
    elif str(value).lower() == "random":
        seed = int.from_bytes(os.urandom(4), "little")
    else:
        try:
            seed = int(value)
        except ValueError:
            raise pytest.UsageError(f"--deltaproof-seed: an integer or 'random' (got {value!r})") from None
    config._deltaproof_seed = seed


def _seed(config):
    return getattr(config, "_deltaproof_seed", None)


def pytest_report_header(config):
    if config.getoption("deltaproof_seed") is None and config.getoption("deltaproof_max_cases") is None:
        return None
    from ._version import __version__
    return (f"deltaproof {__version__}: seed {_seed(config)}, "
            f"max cases {config.getoption('deltaproof_max_cases') or 'per test'}")


@pytest.fixture
def deltaproof_check(request):
    """check(fn, op=..., **check_kernel_args) -> Report; AssertionError with the shrunk case."""
    config = request.config
    seed, max_cases = _seed(config), config.getoption("deltaproof_max_cases")
    log = print if config.getoption("deltaproof_log") else None

    def check(fn, op="linear", **check_kernel_args):
        __tracebackhide__ = True
        args = dict(check_kernel_args)
        if seed is not None:
            args["seed"] = seed
        args.setdefault("seed", 0)
        if max_cases is not None:
            args["max_cases"] = max_cases
        if log is not None:
            args.setdefault("log", log)
        rerun = (f"reproduce: pytest {request.node.nodeid} --deltaproof-seed={args['seed']}"
                 + (f" --deltaproof-max-cases={max_cases}" if max_cases is not None else ""))
        return assert_kernel_agrees(fn, op=op, rerun=rerun, **args)

    return check
