"""Packaging without building: pyproject.toml names every subpackage and the pytest plugin, the
version comes from VERSION (or from the installed metadata, only when it describes this very
package), and a Python that cannot import _core (another version than the building one) judges
through the C library. pip_install_test.sh builds and installs the wheel itself."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import deltaproof

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_SOURCE = os.path.join(REPO, "python", "deltaproof")
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _pyproject():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_version_file_is_a_release_number():
    with open(os.path.join(REPO, "VERSION"), encoding="utf-8") as f:
        text = f.read()
    assert re.fullmatch(r"\d+\.\d+\.\d+\n", text), repr(text)


def test_pyproject_lists_every_subpackage_and_the_plugin():
    project = _pyproject()
    setuptools = project["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "python"}
    found = sorted("deltaproof" + root[len(PACKAGE_SOURCE):].replace(os.sep, ".")
                   for root, dirs, files in os.walk(PACKAGE_SOURCE) if "__init__.py" in files)
    assert sorted(setuptools["packages"]) == found
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}
    plugins = project["project"]["entry-points"]["pytest11"]
    assert plugins == {"deltaproof.pytest_plugin": "deltaproof.pytest_plugin"}  # -p with that name is then a no-op
    assert os.path.isfile(os.path.join(PACKAGE_SOURCE, "pytest_plugin.py"))
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"


def test_the_package_here_reports_the_repository_version():
    from deltaproof._version import __version__
    package = os.path.dirname(os.path.realpath(deltaproof.__file__))
    with open(os.path.join(REPO, "VERSION"), encoding="utf-8") as f:
        expected = f.read().strip()
    if package.startswith(os.path.realpath(REPO) + os.sep):
        assert __version__ == expected  # the source tree, a build tree inside it, or an overlay of it
    elif os.path.isfile(os.path.join(package, "VERSION")):  # a build tree elsewhere, VERSION copied beside
        assert __version__ == expected
    else:  # installed: the metadata's version, which the build took from VERSION
        from importlib import metadata
        assert __version__ == metadata.version("deltaproof")


def _version_in(tmp_path, package_dir, extra_path=None):
    """deltaproof._version.version() for a copy of _version.py in package_dir, in a fresh interpreter."""
    os.makedirs(package_dir, exist_ok=True)
    shutil.copy(os.path.join(PACKAGE_SOURCE, "_version.py"), os.path.join(package_dir, "_version.py"))
    code = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {extra_path!r}) if {extra_path!r} else None
        spec = importlib.util.spec_from_file_location("v", {os.path.join(package_dir, "_version.py")!r})
        module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
        print(module.__version__)""")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-S", "-c", code], check=True, stdout=subprocess.PIPE,
                          universal_newlines=True, env=env, cwd=str(tmp_path)).stdout.strip()


def test_version_is_found_from_a_source_or_build_tree(tmp_path):
    repo = tmp_path / "repo"
    os.makedirs(repo / "python" / "deltaproof")
    (repo / "VERSION").write_text("9.8.7\n")
    (tmp_path / "VERSION").write_text("1.1.1\n")  # above the repository: not the package's
    assert _version_in(tmp_path, str(repo / "python" / "deltaproof")) == "9.8.7"
    assert _version_in(tmp_path, str(repo / "build" / "release" / "python" / "deltaproof")) == "9.8.7"
    assert _version_in(tmp_path, str(tmp_path / "elsewhere" / "deltaproof")) == "0+unknown"
    (tmp_path / "elsewhere" / "deltaproof" / "VERSION").write_text("2.2.2\n")  # shipped beside the package
    assert _version_in(tmp_path, str(tmp_path / "elsewhere" / "deltaproof")) == "2.2.2"


def test_installed_metadata_counts_only_for_its_own_files(tmp_path):
    site = tmp_path / "site"
    info = site / "deltaproof-3.4.5.dist-info"
    os.makedirs(info)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deltaproof\nVersion: 3.4.5\n")
    (info / "RECORD").write_text("deltaproof/_version.py,,\n")
    repo = tmp_path / "repo"
    os.makedirs(repo / "python" / "deltaproof")
    (repo / "VERSION").write_text("9.8.7\n")
    assert _version_in(tmp_path, str(site / "deltaproof"), str(site)) == "3.4.5"  # the installed package
    assert _version_in(tmp_path, str(repo / "python" / "deltaproof"), str(site)) == "9.8.7"  # a tree beside it


def _without_core(code):
    """Runs code in a fresh interpreter where deltaproof._core cannot be imported, as on a Python
    other than the one _core was built for."""
    prelude = textwrap.dedent("""
        import importlib.abc, sys
        class NoCore(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "deltaproof._core":
                    raise ImportError("_core is built for another Python")
        sys.meta_path.insert(0, NoCore())
        sys.path.insert(0, %r)
        """) % os.path.join(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, env=dict(os.environ), timeout=600)


def test_without_core_check_kernel_judges_through_the_c_library():
    judge = os.path.join(os.path.dirname(deltaproof.__file__), "libdeltaproof_judge.so")
    if not os.path.isfile(judge):
        pytest.skip(f"{judge} not built")
    run = _without_core("""
        import deltaproof
        from deltaproof import _backend
        from numpy_kernels import numpy_kernel
        assert _backend._core_module is None, "the hook did not hide _core"
        good = deltaproof.check_kernel(numpy_kernel(), op="gated-delta", dtypes=("bf16", "fp32"), max_cases=6,
                                       backward=False)
        bad = deltaproof.check_kernel(numpy_kernel("mask_off_by_one"), op="linear", dtypes=("fp32",), max_cases=6,
                                      backward=False)
        assert good.passed, str(good)
        assert not bad.passed and bad.counterexample.case.tokens <= 4, str(bad)
        try:
            deltaproof.linear_attention.recurrent([[1.0]], [[1.0]], [[1.0]])
        except ImportError as e:
            print("oracle forms:", e)
        print("ctypes path ok")
        """)
    assert run.returncode == 0, run.stdout
    assert "ctypes path ok" in run.stdout
    assert "oracle forms: deltaproof._core is not importable here" in run.stdout, run.stdout
