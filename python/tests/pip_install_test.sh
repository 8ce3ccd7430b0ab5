#!/usr/bin/env bash
# `pip install .` from a clean copy of the repository into a fresh virtual environment, then
# deltaproof used without PYTHONPATH: the version, check_kernel through _core, the pytest plugin
# through its entry point, the wheel's name and contents, and the C judge alone (the installed _core
# removed, as on a Python other than the building one). Compiles the judge and the module: minutes.
#
#   bash python/tests/pip_install_test.sh [REPOSITORY]     (default: the repository holding this script)
#
# Offline: pip runs with --no-index --no-build-isolation (setuptools, wheel, numpy and pytest come
# from the system, through --system-site-packages). CMAKE_BUILD_PARALLEL_LEVEL sets the compile jobs
# (default 2). KEEP=1 keeps the scratch folder.
set -euo pipefail
repo=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
python=${PYTHON:-/usr/bin/python3}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/deltaproof-pip.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$scratch"' EXIT
say() { printf '%s pip_install_test: %s\n' "$(date +%T)" "$*"; }
fail() { say "FAIL: $*"; exit 1; }

# A clean copy: the files git tracks, plus untracked ones it does not ignore (no build/ folder);
# outside a git checkout, everything but build/.
mkdir "$scratch/src"
if git -C "$repo" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
     [ -e "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -xf - -C "$scratch/src"
else
  (cd "$repo" && tar --exclude=./build -cf - .) | tar -xf - -C "$scratch/src"
fi
expected=$(cat "$scratch/src/VERSION")

"$python" -m venv --system-site-packages "$scratch/venv"
venv_python="$scratch/venv/bin/python"
unset PYTHONPATH
say "pip install --no-build-isolation --no-index . (version $expected)"
start=$(date +%s)
(cd "$scratch/src" && "$venv_python" -m pip install --no-build-isolation --no-index --no-deps . \
   > "$scratch/pip_install.log" 2>&1) || { tail -40 "$scratch/pip_install.log"; fail "pip install"; }
say "installed in $(( $(date +%s) - start )) s"

cd "$scratch"  # nowhere near the sources
"$venv_python" - "$expected" "$scratch/venv" <<'EOF' || fail "the installed package"
import os, sys
import deltaproof
from deltaproof import _backend
from deltaproof._version import __version__
expected, venv = sys.argv[1], sys.argv[2]
where = os.path.realpath(deltaproof.__file__)
assert where.startswith(os.path.realpath(venv) + os.sep), f"deltaproof imported from {where}"
assert __version__ == expected, (__version__, expected)
assert _backend._core_module is not None, f"_core did not import: {_backend._core_error}"
print(f"deltaproof {__version__} from {os.path.dirname(where)}, _core imported")
EOF

# check_kernel through _core on a planted bug and on the oracle's forms.
"$venv_python" - "$scratch/src/python/tests" <<'EOF' || fail "check_kernel through _core"
import sys
sys.path.insert(0, sys.argv[1])  # numpy_kernels.py only; deltaproof itself is the installed one
import deltaproof
from numpy_kernels import numpy_kernel
assert deltaproof.check_kernel(deltaproof.reference_kernel(), op="delta", max_cases=4).passed
bad = deltaproof.check_kernel(numpy_kernel("drop_partial_chunk"), op="delta", dtypes=("fp32",), max_cases=8,
                              backward=False)
assert not bad.passed and bad.counterexample.case.tokens <= 4, str(bad)
print("check_kernel through _core: oracle agrees, planted bug caught and shrunk to", bad.counterexample.case.describe())
EOF

# The plugin through its entry point (no -p): the example passes; with a planted bug it fails.
example="$scratch/src/python/examples/linear_attention_kernel_test.py"
"$venv_python" -m pytest -q -p no:cacheprovider --rootdir "$scratch" "$example" > "$scratch/pytest.log" 2>&1 \
  || { cat "$scratch/pytest.log"; fail "the example under pytest"; }
sed 's/causal = np.tril(np.ones((c1 - c0, c1 - c0), f32))/causal = np.tril(np.ones((c1 - c0, c1 - c0), f32), -1)/' \
  "$example" > "$scratch/planted_test.py"
cmp -s "$example" "$scratch/planted_test.py" && fail "the bug was not planted"
if "$venv_python" -m pytest -q -p no:cacheprovider --rootdir "$scratch" "$scratch/planted_test.py" \
   > "$scratch/pytest_planted.log" 2>&1; then cat "$scratch/pytest_planted.log"; fail "a planted bug passed"; fi
grep -q "smallest failing case" "$scratch/pytest_planted.log" || { cat "$scratch/pytest_planted.log"; fail "no shrunk case"; }
grep -q -- "--deltaproof-seed=0" "$scratch/pytest_planted.log" || fail "no seed in the failure"
# -p deltaproof.pytest_plugin (the build tree's way) beside the entry point: loaded once, no error.
"$venv_python" -m pytest -q -p no:cacheprovider -p deltaproof.pytest_plugin --rootdir "$scratch" "$example" \
  > "$scratch/pytest_p.log" 2>&1 || { cat "$scratch/pytest_p.log"; fail "-p with the entry point installed"; }
say "pytest plugin by entry point: example passes, planted bug fails with the shrunk case"

# The wheel, from the same copy (CMake's build folder is reused): its name and contents.
start=$(date +%s)
(cd "$scratch/src" && "$venv_python" -m pip wheel --no-build-isolation --no-index --no-deps -w "$scratch/dist" . \
   > "$scratch/pip_wheel.log" 2>&1) || { tail -40 "$scratch/pip_wheel.log"; fail "pip wheel"; }
wheel=$(ls "$scratch"/dist/*.whl)
say "wheel $(basename "$wheel") in $(( $(date +%s) - start )) s (CMake build reused)"
case "$(basename "$wheel")" in
  "deltaproof-$expected-py3-none-linux_"*.whl) ;;
  *) fail "wheel tag: $(basename "$wheel")" ;;
esac
"$venv_python" - "$wheel" <<'EOF' || fail "wheel contents"
import sys, zipfile, sysconfig
names = zipfile.ZipFile(sys.argv[1]).namelist()
for name in names:
    print("   ", name)
need = ["deltaproof/__init__.py", "deltaproof/_version.py", "deltaproof/pytest_plugin.py", "deltaproof/testing.py",
        "deltaproof/adapters/__init__.py", "deltaproof/adapters/fla.py", "deltaproof/libdeltaproof_judge.so",
        "deltaproof/_core" + sysconfig.get_config_var("EXT_SUFFIX")]
missing = [n for n in need if n not in names]
assert not missing, missing
assert any(n.startswith("deltaproof/libgmp.so") for n in names) and any(n.startswith("deltaproof/libmpfr.so") for n in names)
entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
assert "deltaproof.pytest_plugin" in zipfile.ZipFile(sys.argv[1]).read(entry).decode()
EOF

# The C judge alone: the installed _core removed, as a Python other than the building one sees it.
site=$("$venv_python" -c 'import deltaproof, os; print(os.path.dirname(deltaproof.__file__))')
rm "$site"/_core*.so
"$venv_python" - "$scratch/src/python/tests" <<'EOF' || fail "the C judge without _core"
import sys
sys.path.insert(0, sys.argv[1])
import deltaproof
from deltaproof import _backend
from numpy_kernels import numpy_kernel
assert _backend._core_module is None
assert deltaproof.check_kernel(numpy_kernel(), op="gated-delta", max_cases=6, backward=False).passed
bad = deltaproof.check_kernel(numpy_kernel("lose_h0"), op="gated-delta", dtypes=("fp32",), max_cases=6, backward=False)
assert not bad.passed and bad.counterexample.case.h0
try:
    deltaproof.delta_rule.recurrent([[1.0]], [[1.0]], [[1.0]], [0.5])
    raise SystemExit("the oracle's forms ran without _core")
except ImportError as e:
    print("without _core: check_kernel through libdeltaproof_judge.so; the oracle's forms say:", str(e)[:80])
EOF
say "PASS"
