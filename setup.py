"""The compiled half of the `deltaproof` wheel (metadata: pyproject.toml).

`build_ext` runs CMake on the repository with the library-only options (no tests, no CUDA), builds
the C judge `deltaproof_judge_c` (libdeltaproof_judge.so, loaded through ctypes by any Python 3,
with libgmp and libmpfr copied beside it and RPATH $ORIGIN) and, where the build found pybind11 and
this interpreter's headers, the pybind11 module `deltaproof_core` (_core.<this Python's suffix>.so),
and copies them into the package. The wheel is tagged py3-none-<platform>: it installs into any
Python 3 on the platform; an interpreter other than the building one cannot import _core and
judges through the C library (the oracle's forms need _core).

Environment:
  DELTAPROOF_CMAKE_BUILD_DIR  CMake's build folder (default build/python-cmake)
  DELTAPROOF_CMAKE_ARGS       extra configure arguments (shell words)
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default 2)
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 has its own; before, the wheel package provides it
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # metadata steps run before the build backend has installed wheel
        bdist_wheel = None

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE_BUILD = os.path.join("build", "python-package")
LIBRARY_OPTIONS = ["-DDELTAPROOF_BUILD_TESTS=OFF", "-DDELTAPROOF_BUILD_CUDA=OFF"]
# Two levels below the root, as the presets' build folders: ccache then finds what they compiled.
CMAKE_BUILD = os.path.join("build", "python-cmake")


class BinaryDistribution(Distribution):
    """Compiled files inside: a platform wheel, installed to platlib."""

    def has_ext_modules(self):
        return True


class build_cmake(build_ext):
    """Builds the compiled parts with CMake and copies them into the package."""

    def run(self):
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("deltaproof: cmake not found (Debian: apt-get install cmake ninja-build; see "
                               "tools/install_dependencies.sh)")
        build_dir = os.path.abspath(os.environ.get("DELTAPROOF_CMAKE_BUILD_DIR",
                                                   os.path.join(ROOT, CMAKE_BUILD)))
        os.makedirs(build_dir, exist_ok=True)
        configure = [cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", *LIBRARY_OPTIONS]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        try:  # a pybind11 installed with pip (Debian's pybind11-dev is found by CMake itself)
            import pybind11
            configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        configure += shlex.split(os.environ.get("DELTAPROOF_CMAKE_ARGS", ""))
        self._run(configure)

        targets = subprocess.run([cmake, "--build", build_dir, "--target", "help"], check=True,
                                 stdout=subprocess.PIPE, universal_newlines=True).stdout
        if not re.search(r"\bdeltaproof_judge_c\b", targets):
            raise RuntimeError("deltaproof: the CMake configuration has no target deltaproof_judge_c")
        with_core = re.search(r"\bdeltaproof_core\b", targets) is not None
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        self._run([cmake, "--build", build_dir, "--parallel", jobs, "--target", "deltaproof_judge_c"]
                  + (["deltaproof_core"] if with_core else []))

        products = os.path.join(build_dir, "python", "deltaproof")
        files = sorted(glob.glob(os.path.join(products, "lib*.so*")))
        core = os.path.join(products, "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
        if with_core:
            if not os.path.isfile(core):
                raise RuntimeError(f"deltaproof: {core} was not built")
            files.append(core)
        else:
            print("deltaproof: pybind11 or this Python's headers not found: the wheel holds the C judge "
                  "only (check_kernel and judge work; the oracle's forms need _core)", file=sys.stderr)
        if not any(os.path.basename(f) == "libdeltaproof_judge.so" for f in files):
            raise RuntimeError(f"deltaproof: libdeltaproof_judge.so not found in {products}")
        destination = os.path.join(ROOT, "python", "deltaproof") if self.inplace else \
            os.path.join(self.build_lib, "deltaproof")
        os.makedirs(destination, exist_ok=True)
        self._outputs = []
        for f in files:
            target = os.path.join(destination, os.path.basename(f))
            shutil.copyfile(f, target)
            shutil.copymode(f, target)
            self._outputs.append(target)

    def get_outputs(self):
        return list(getattr(self, "_outputs", []))

    @staticmethod
    def _run(command):
        print("deltaproof: " + " ".join(shlex.quote(c) for c in command), file=sys.stderr)
        subprocess.run(command, check=True)


commands = {"build_ext": build_cmake}
if bdist_wheel is not None:
    class bdist_wheel_py3(bdist_wheel):
        """py3-none-<platform>: the C library serves every Python 3; _core, the building one."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    commands["bdist_wheel"] = bdist_wheel_py3

os.makedirs(os.path.join(ROOT, PACKAGE_BUILD), exist_ok=True)
setup(distclass=BinaryDistribution, cmdclass=commands,
      options={"build": {"build_base": os.path.join(PACKAGE_BUILD, "setuptools")},
               "egg_info": {"egg_base": PACKAGE_BUILD}})
