"""deltaproof.__version__: the installed distribution's version, or the repository's VERSION file.

An installed wheel answers through its metadata. A source or build tree on PYTHONPATH (the package
copied into <build>/python/deltaproof/, or python/deltaproof/ itself) has no metadata of its own:
the version is then read from VERSION at the root of the repository the package sits in. The
metadata is believed only when it describes this very file, so a tree on PYTHONPATH is not given the
version of some other deltaproof installed in site-packages.
"""
import os

UNKNOWN = "0+unknown"


def _from_metadata(here):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return None
    try:
        dist = metadata.distribution("deltaproof")
    except metadata.PackageNotFoundError:
        return None
    try:
        if os.path.samefile(str(dist.locate_file("deltaproof/_version.py")), here):
            return dist.version
    except OSError:  # the distribution's files are elsewhere (another install, an editable one)
        pass
    return None


def _read(path):
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    return text or None


def _from_tree(here):
    """VERSION beside the package, or at the first folder above it that holds both VERSION and
    python/deltaproof/ (the repository root; a build tree inside it finds it too)."""
    package = os.path.dirname(here)
    if os.path.isfile(os.path.join(package, "VERSION")):
        return _read(os.path.join(package, "VERSION"))
    folder = package
    while True:
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
        if os.path.isfile(os.path.join(folder, "VERSION")) and os.path.isdir(os.path.join(folder, "python",
                                                                                             "deltaproof")):
            return _read(os.path.join(folder, "VERSION"))


def version():
    here = os.path.realpath(os.path.abspath(__file__))  # through the symlinks of an overlay
    for find in (_from_metadata, _from_tree):
        found = find(here)
        if found:
            return found
    return UNKNOWN


__version__ = version()
