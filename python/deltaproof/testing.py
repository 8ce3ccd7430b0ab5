"""check_kernel as an assertion for test suites.

    from deltaproof.testing import assert_kernel_agrees
    def test_my_kernel():
        assert_kernel_agrees(my_kernel, op="delta", dtypes=("bf16",), max_cases=16)

assert_kernel_agrees returns the Report when every case agrees and otherwise raises AssertionError
whose message is the smallest failing case, its verdict table, the settings that reproduce the run
(seed included) and the failing rows of the case table. With pytest, the fixture
``deltaproof_check`` of deltaproof.pytest_plugin does the same and applies --deltaproof-seed and
--deltaproof-max-cases.
"""
from .check import check_kernel

__all__ = ["assert_kernel_agrees", "failure_message"]


def _settings_line(settings):
    shown = ("op", "layout", "dtypes", "chunk_sizes", "max_cases", "seed", "backward", "varlen", "tf32", "head_dims",
             "scale", "qk_l2norm", "initial_state", "state_dtype")
    return ", ".join(f"{k}={settings[k]!r}" for k in shown if k in settings)


def failure_message(report, rerun=None):
    """The text of the AssertionError for a Report that did not pass: the smallest failing case and
    its verdict table first, then the report's notes (the kernel's error, hints, inconclusive cases),
    how to reproduce the run, and the failing rows of the case table.
    rerun: the line saying how to reproduce (default: the check_kernel call's settings)."""
    seed = report.settings.get("seed")
    failures = report.failures
    if failures:
        head = (f"{report.kernel_name} disagrees with the oracle: {len(failures)} of {len(report.cases)} cases fail "
                f"(seed {seed})")
    else:
        head = f"{report.kernel_name}: no case agrees with the oracle of {len(report.cases)} run (seed {seed})"
    text = str(report)
    blocks = text.split("\n\n")  # the table, then the report's notes, the smallest failing case last
    table = blocks[0].splitlines()
    shrunk = [b for b in blocks[1:] if b.startswith("smallest failing case")]
    notes = [b for b in blocks[1:] if not b.startswith("smallest failing case")]
    lines = [head] + shrunk + notes
    lines.append(rerun or f"reproduce: check_kernel({report.kernel_name}, {_settings_line(report.settings)})")
    failed = {id(c) for c in failures}
    rows = [table[2 + i] for i, c in enumerate(report.cases) if id(c) in failed and 2 + i < len(table)]
    if rows:
        lines += ["failing cases:"] + table[1:2] + rows
    return "\n".join(lines)


def assert_kernel_agrees(fn, op="linear", rerun=None, **check_kernel_args):
    """check_kernel(fn, op=op, **check_kernel_args); AssertionError (failure_message) unless every
    case agrees. Returns the Report."""
    __tracebackhide__ = True  # pytest: the assertion, not this frame, is the failure
    report = check_kernel(fn, op=op, **check_kernel_args)
    if not report.passed:
        raise AssertionError(failure_message(report, rerun))
    return report
