#!/usr/bin/env python3
"""Times verify::judge (through deltaproof.judge) on one bf16 case, forward and backward.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/bench_judge.py [--op delta] [--B 8 --H 16 --L 4096 --D 128]

The candidate is the oracle's own output rounded to bf16 (o, dq, dk, dv, dβ) and fp32 (ht, dh0, dg),
as a kernel would store it; the script prints, for the oracle call that makes it and for the two
judge calls (forward: o, ht; backward: o, ht and every gradient), the wall time, the process's CPU
time (user and system, all threads) and the 1-minute load average before and after (the machine is
shared: a load above the core count inflates wall time, not CPU time), and the verdict tables.
Target: judging forward and backward at B=8, H=16, L=4096, D=128 in <= 60 s on 2 cores.
Memory: 7.6 GB at peak (measured, /usr/bin/time -v) for the default shape.
"""
import argparse
import gc
import json
import math
import os
import time


import numpy as np

import deltaproof  # from PYTHONPATH (build/release/python)
from deltaproof.dtypes import round_to


class Phase:
    """Wall and CPU time of one phase, and the load average around it."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.load0, self.t0, self.c0 = os.getloadavg()[0], time.perf_counter(), os.times()
        return self

    def __exit__(self, *exc):
        c1 = os.times()
        self.wall = time.perf_counter() - self.t0
        self.user, self.system = c1.user - self.c0.user, c1.system - self.c0.system
        self.load1 = os.getloadavg()[0]

    def line(self):
        return (f"{self.name}: {self.wall:.1f} s wall, CPU {self.user:.1f} s user + {self.system:.1f} s system, "
                f"load {self.load0:.1f} -> {self.load1:.1f}")

    def record(self):
        return {"wall_s": self.wall, "user_s": self.user, "system_s": self.system, "load": [self.load0, self.load1]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="gated-delta", choices=["linear", "delta", "gated-delta"])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--L", type=int, default=4096)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--threads", type=int, default=0, help="judge threads (0: every core)")
    p.add_argument("--json", help="write the timings here")
    a = p.parse_args()

    rng = np.random.default_rng(0)
    B, T, H, D = a.B, a.L, a.H, a.D
    shape = (B, T, H, D)
    # The design's accuracy workload: q ~ N(0,1)/sqrt(D), k = normalize(N(0,1)), v ~ N(0,1),
    # beta = sigmoid(N(0,1)), g = logsigmoid(N(0,1) + 3), all rounded to bf16 (g fp32).
    inputs = {"q": round_to((rng.standard_normal(shape, dtype=np.float32) / math.sqrt(D)), "bf16")}
    k = rng.standard_normal(shape, dtype=np.float32)
    k /= np.sqrt((k * k).sum(-1, keepdims=True))
    inputs["k"] = round_to(k, "bf16")
    del k
    inputs["v"] = round_to(rng.standard_normal(shape, dtype=np.float32), "bf16")
    if a.op != "linear":
        inputs["beta"] = round_to(1 / (1 + np.exp(-rng.standard_normal((B, T, H)))), "bf16")
    if a.op == "gated-delta":
        inputs["g"] = round_to(-np.logaddexp(0, -(rng.standard_normal((B, T, H)) + 3)), "fp32")
    inputs["do"] = round_to(rng.standard_normal(shape, dtype=np.float32), "bf16")
    print(f"op={a.op} B={B} H={H} L={T} D={D} bf16, cores={os.cpu_count()}", flush=True)

    with Phase("oracle (candidate outputs, forward+backward)") as p_oracle:
        reference = deltaproof.oracle(a.op, inputs, layout="blhd", dtype="bf16", threads=a.threads)
    candidate = {}
    for name in list(reference):
        stored = "fp32" if name in ("ht", "dh0", "dg") else "bf16"
        candidate[name] = round_to(reference.pop(name), stored)
    del reference
    gc.collect()
    print(p_oracle.line(), flush=True)

    forward_inputs = {k: v for k, v in inputs.items() if k != "do"}
    with Phase("judge forward") as p_forward:
        forward = deltaproof.judge(a.op, forward_inputs, {"o": candidate["o"], "ht": candidate["ht"]}, dtype="bf16",
                                   threads=a.threads)
    print(f"{p_forward.line()}\n{forward}", flush=True)

    with Phase("judge forward+backward") as p_backward:
        backward = deltaproof.judge(a.op, inputs, candidate, dtype="bf16", threads=a.threads)
    print(f"{p_backward.line()}\n{backward}", flush=True)
    print(f"oracle share of the kernel bound: {backward.oracle_share}, units in High: "
          f"{backward.units_in_high}/{backward.units}")
    result = {"op": a.op, "B": B, "H": H, "L": T, "D": D, "cores": os.cpu_count(), "oracle": p_oracle.record(),
              "judge_forward": p_forward.record(), "judge_forward_backward": p_backward.record(),
              "forward_agrees": forward.agrees, "backward_agrees": backward.agrees,
              "oracle_share": backward.oracle_share}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
