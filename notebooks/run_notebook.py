#!/usr/bin/env python3
"""Execute a worked notebook from a clean kernel, as CI does, and compare with what is committed.

    run_notebook.py NOTEBOOK            execute; fail on any cell error or on outputs that differ from
                                        the committed ones (numbers aside: timings and float digits
                                        move from machine to machine; words, tables and plots must not)
    run_notebook.py NOTEBOOK --write    execute and save the outputs into NOTEBOOK (to commit them)

The kernel is the interpreter running this script (Debian's /usr/bin/python3 in CI), started in the
notebook's folder with this process's environment (PYTHONPATH must reach the built package).
"""
import argparse
import copy
import json
import os
import re
import shutil
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def kernelspec_dir():
    """A kernelspec that runs sys.executable, so the kernel is this interpreter whatever is on PATH."""
    root = tempfile.mkdtemp(prefix="deltaproof-kernel-")
    spec = os.path.join(root, "kernels", "deltaproof-python")
    os.makedirs(spec)
    with open(os.path.join(spec, "kernel.json"), "w") as f:
        json.dump({"argv": [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "Python 3", "language": "python"}, f)
    return root


def joined_streams(outputs):
    """The kernel flushes stdout on a timer, so one cell's text may arrive in one piece or several:
    consecutive pieces of one stream are joined (before masking, so a number split in two stays one)."""
    joined = []
    for out in outputs:
        if out.get("output_type") == "stream" and joined and joined[-1].get("output_type") == "stream" \
                and joined[-1].get("name") == out.get("name"):
            joined[-1] = {**joined[-1], "text": joined[-1].get("text", "") + out.get("text", "")}
        else:
            joined.append(out)
    return joined


def shape_of(outputs):
    """What must not change between runs: output kinds, text with numbers masked, images present."""
    shown = []
    for out in joined_streams(outputs):
        kind = out.get("output_type")
        if kind == "stream":
            shown.append(("stream", out.get("name"), NUMBER.sub("#", ADDRESS.sub("@", out.get("text", "")))))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            text = data.get("text/plain", "")
            text = "".join(text) if isinstance(text, list) else text
            shown.append((kind, sorted(k for k in data if k != "text/plain") or None,
                          None if "image/png" in data else NUMBER.sub("#", ADDRESS.sub("@", text))))
        elif kind == "error":
            shown.append(("error", out.get("ename")))
    return shown


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook")
    parser.add_argument("--write", action="store_true", help="save the executed outputs into the notebook")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed for one cell")
    args = parser.parse_args()

    committed = nbformat.read(args.notebook, as_version=4)
    executed = copy.deepcopy(committed)
    for cell in executed.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    spec_root = kernelspec_dir()
    os.environ["JUPYTER_PATH"] = spec_root + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(executed, timeout=args.timeout, kernel_name="deltaproof-python",
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(args.notebook))}})
    start = time.monotonic()
    try:
        client.execute()
    except CellExecutionError as error:
        print(f"{args.notebook}: a cell failed\n{error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(spec_root, ignore_errors=True)
    elapsed = time.monotonic() - start
    print(f"{args.notebook}: executed in {elapsed:.1f} s")

    if args.write:
        executed.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(executed, args.notebook)
        print(f"{args.notebook}: outputs written")
        return 0

    code = [(i, c) for i, c in enumerate(committed.cells) if c.cell_type == "code"]
    fresh = [c for c in executed.cells if c.cell_type == "code"]
    for (i, old), new in zip(code, fresh):
        if shape_of(old.outputs) != shape_of(new.outputs):
            print(f"{args.notebook}: cell {i} gives other outputs than the committed ones "
                  f"(rerun with --write and commit, or find what changed)\ncommitted: {shape_of(old.outputs)}\n"
                  f"now:       {shape_of(new.outputs)}", file=sys.stderr)
            return 1
    if not any(old.outputs for _, old in code):
        print(f"{args.notebook}: committed without outputs (run with --write)", file=sys.stderr)
        return 1
    print(f"{args.notebook}: outputs match the committed ones (numbers aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
