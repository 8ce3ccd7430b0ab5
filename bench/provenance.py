"""Provenance of a measurement: date, commit, GPU, library versions and the command that made it.

Every JSON record under bench/results/ carries one top-level object of this form:

    "provenance": {
      "date": "2026-12-04T17:21:02+00:00",   # when the measurement ran (UTC)
      "commit": "09721eb",                   # the tree measured ("commit_source" says how it is known)
      "commit_source": "measured build",     # or "git log": the commit that added the record
      "gpu": "NVIDIA H200",                  # or "none (CPU)"
      "host": "...",                         # CPU and machine facts, where recorded
      "versions": {"torch": "...", ...},     # only what was recorded; "not recorded" otherwise
      "command": "..."                       # re-runnable from the repository root
    }

A record merged from several runs adds "parts": a list of such objects, each with "selects" (the
benchmark families or passes it covers). collect() builds the object for a run made now; the
scripts of bench/gpu/ and bench/peers/ call it.
"""
import datetime
import os
import platform
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit():
    """The short hash of the checkout, with '+dirty' where tracked files differ from it."""
    head = _run(["git", "rev-parse", "--short", "HEAD"])
    if not head:
        return "not recorded (no git checkout)"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + ("+dirty" if dirty else "")


def gpu_name():
    names = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return names.splitlines()[0].strip() if names else "none (CPU)"


def versions(modules=("numpy", "torch", "triton", "fla")):
    out = {"python": platform.python_version()}
    for name in modules:
        module = sys.modules.get(name)
        if module is not None:
            out[name] = str(getattr(module, "__version__", "?"))
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if driver:
        out["nvidia_driver"] = driver.splitlines()[0].strip()
    return out


def command(script, args):
    """`python3 SCRIPT ARGS...`, the script relative to the repository root where it lies inside it."""
    rel = os.path.relpath(os.path.abspath(script), ROOT)
    return shlex.join(["python3", rel if not rel.startswith("..") else script] + [str(a) for a in args])


def collect(script, args, gpu=None, extra_versions=None):
    """The provenance object of a run made now (UTC date, checkout commit, GPU, versions, command)."""
    v = versions()
    v.update(extra_versions or {})
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "commit_source": "checkout at run time",
            "gpu": gpu or gpu_name(), "host": f"{platform.node()}, {os.cpu_count()} CPUs",
            "versions": v, "command": command(script, args)}


def stamp(path, command_line, gpu=None, extra_versions=None):
    """Puts a provenance object first in the JSON at path (a Google Benchmark file, say), keeping the rest."""
    import json
    with open(path) as f:
        data = json.load(f)
    record = {"date": data.get("context", {}).get("date") or
              datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit(), "commit_source": "checkout at run time", "gpu": gpu or gpu_name(),
              "host": f"{platform.node()}, {os.cpu_count()} CPUs",
              "versions": dict(extra_versions or {}), "command": command_line}
    data = {"provenance": record, **{k: v for k, v in data.items() if k != "provenance"}}
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Put the provenance of a run made now into its JSON record.")
    parser.add_argument("json", help="the record to stamp (rewritten in place)")
    parser.add_argument("--command", required=True, help="the command that made it, re-runnable from the root")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VALUE",
                        help="a library version to record (repeatable)")
    a = parser.parse_args()
    stamp(a.json, a.command, extra_versions=dict(v.split("=", 1) for v in a.version))
