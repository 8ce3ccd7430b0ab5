"""deltaproof.testing.assert_kernel_agrees and the pytest plugin (fixture deltaproof_check, options
--deltaproof-seed, --deltaproof-max-cases, --deltaproof-log), run on python/examples/ in a pytest
subprocess: the example passes as written and fails, with the shrunk case in its message, once a bug
is planted in its kernel."""
import os
import re
import subprocess
import sys

import pytest

import deltaproof
from deltaproof.testing import assert_kernel_agrees
from numpy_kernels import numpy_kernel

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "linear_attention_kernel_test.py")
FAITHFUL_MASK = "causal = np.tril(np.ones((c1 - c0, c1 - c0), f32))"
PLANTED_MASK = "causal = np.tril(np.ones((c1 - c0, c1 - c0), f32), -1)"  # a token does not see itself


def test_assert_kernel_agrees_returns_the_report_when_every_case_agrees():
    report = assert_kernel_agrees(numpy_kernel(), op="delta", dtypes=("fp32",), max_cases=4, backward=False)
    assert isinstance(report, deltaproof.Report) and report.passed and len(report.cases) == 4


def test_assert_kernel_agrees_raises_with_the_shrunk_case_and_its_table():
    with pytest.raises(AssertionError) as caught:
        assert_kernel_agrees(numpy_kernel("lose_h0"), op="gated-delta", dtypes=("fp32",), max_cases=6, seed=4,
                             backward=False)
    message = str(caught.value)
    first, shrunk = message.splitlines()[:2]
    assert first.startswith("numpy_kernel[lose_h0] disagrees with the oracle") and "(seed 4)" in first
    assert shrunk.startswith("smallest failing case (") and " h0 " in shrunk + " "
    tokens = re.search(r"L=(\d+)", shrunk)
    assert tokens and int(tokens.group(1)) <= 2, shrunk
    assert "DISAGREE" in message  # the failing rows of the case table
    assert "reproduce: check_kernel(numpy_kernel[lose_h0], op='gated-delta'" in message and "seed=4" in message
    assert message.count("\n") < 80  # the shrunk case and the failing rows, not every case


def test_a_kernel_that_raises_fails_with_its_exception_in_the_message():
    def broken(args):
        raise RuntimeError("no kernel for DK=15")

    with pytest.raises(AssertionError, match="kernel raised RuntimeError: no kernel for DK=15"):
        assert_kernel_agrees(broken, op="linear", dtypes=("fp32",), max_cases=2, backward=False)


# ---------------------------------------------------------------------------------------------
# The plugin, in a pytest subprocess on the example

def _pytest(path, *options, quiet=True):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", *(["-q"] if quiet else []), "-p", "no:cacheprovider",
               "-p", "deltaproof.pytest_plugin",
               "--rootdir", os.path.dirname(path), *options, path]
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, env=env,
                         cwd=os.path.dirname(path), timeout=600)
    return run.returncode, run.stdout


@pytest.fixture
def planted(tmp_path):
    with open(EXAMPLE, encoding="utf-8") as f:
        source = f.read()
    assert source.count(FAITHFUL_MASK) == 1
    path = tmp_path / "planted_linear_attention_kernel_test.py"
    path.write_text(source.replace(FAITHFUL_MASK, PLANTED_MASK), encoding="utf-8")
    return str(path)


def test_the_example_passes_and_prints_nothing_of_its_cases():
    rc, out = _pytest(EXAMPLE)
    assert rc == 0, out
    assert "1 passed" in out and "[1/" not in out and "agree" not in out, out


def test_the_example_with_a_planted_bug_fails_with_the_shrunk_case(planted):
    rc, out = _pytest(planted)
    assert rc == 1, out
    assert "AssertionError" in out and "1 failed" in out
    shrunk = re.search(r"smallest failing case \(\d+ shrink steps\): (linear [^\n]*)", out)
    assert shrunk, out
    case = shrunk.group(1)
    assert re.search(r"\bL=1\b", case) and "H=1" in case and "DK=1 DV=1" in case, case
    assert "disagrees with the oracle" in out and "DISAGREE" in out
    assert re.search(r"reproduce: pytest \S+::test_linear_attention_agrees_with_the_oracle --deltaproof-seed=0\b",
                     out), out


def test_the_options_reach_check_kernel(planted):
    rc, out = _pytest(planted, "--deltaproof-seed=7", "--deltaproof-max-cases=3", quiet=False)
    assert rc == 1, out
    assert re.search(r"^deltaproof \S+: seed 7, max cases 3$", out, re.M), out  # the header
    assert re.search(r"disagrees with the oracle: \d of 3 cases fail \(seed 7\)", out), out
    assert "--deltaproof-seed=7 --deltaproof-max-cases=3" in out


def test_a_random_seed_is_printed_and_reproduces(planted):
    rc, out = _pytest(planted, "--deltaproof-seed=random", "--deltaproof-max-cases=2", quiet=False)
    assert rc == 1, out
    seed = re.search(r"--deltaproof-seed=(\d+) --deltaproof-max-cases=2", out)
    assert seed, out
    header = re.search(r"deltaproof \S+: seed (\d+), max cases 2", out)
    assert header and header.group(1) == seed.group(1)
    failing = re.search(r"smallest failing case[^\n]*", out).group(0)
    rc2, again = _pytest(planted, f"--deltaproof-seed={seed.group(1)}", "--deltaproof-max-cases=2")
    assert rc2 == 1 and failing in again, again


def test_the_log_option_prints_one_line_per_case():
    rc, out = _pytest(EXAMPLE, "-s", "--deltaproof-log", "--deltaproof-max-cases=3")
    assert rc == 0, out
    assert all(f"[{i}/3]" in out for i in (1, 2, 3)), out


def test_a_bad_seed_is_a_usage_error():
    rc, out = _pytest(EXAMPLE, "--deltaproof-seed=seven")
    assert rc == 4 and "--deltaproof-seed: an integer or 'random'" in out, out
