"""What check_kernel reports: the whole run (`Report`: counts of agree, disagree, inconclusive and
error, a table per case and per verdict with each error measured as its bound is stated, JSON), the
progress lines and bar on a terminal, and hints where errors have one evident cause."""
import json
import math
import os
import sys
import time

import numpy as np

from .cases import inputs_of

STATUSES = ("agree", "disagree", "inconclusive", "error")


def _ratio(row):
    """A verdict row's err/bound; infinite where the JSON holds null (an error beside a zero bound,
    or a non-finite candidate)."""
    return float("inf") if row.get("ratio") is None or not row["finite"] else row["ratio"]


def _norm_label(row):
    """How a verdict row's error and bound are measured, as the judge states it: an entry, a row's
    2-norm, or a whole state's Frobenius norm."""
    return {"frobenius": "‖·‖F", "rowwise": "row‖·‖₂"}.get(row.get("norm"), "entry")


_SHORT_REGIMES = {"keys_unnormalized": "k-unnorm", "beta_small": "β≈0", "beta_one": "β≈1",
                  "gates_very_negative": "g≪0"}


def _g(x):
    return "-" if x is None else ("nan" if isinstance(x, float) and math.isnan(x) else f"{x:.3g}")


class Report:
    """What check_kernel found: ``.passed``, ``.cases`` (CaseResult per case), ``.counts`` (agree,
    disagree, inconclusive, error), ``.counterexample`` (the shrunk failing CaseResult, with
    ``.inputs``), ``.first_failure``, ``.coverage`` (pairs of attribute values covered, total),
    ``.cases_not_run`` and ``.stopped_by``, ``.shrink_stopped_by``; prints as a table."""

    def __init__(self, kernel_name, settings, cases, counterexample=None, first_failure=None, shrink_steps=0,
                 cases_not_run=0, stopped_by=None, shrink_stopped_by=None, coverage=None, seconds=None,
                 hints=()):
        self.kernel_name = kernel_name
        self.settings = settings
        self.cases = cases
        self.counterexample = counterexample
        self.first_failure = first_failure
        self.shrink_steps = shrink_steps
        self.cases_not_run = cases_not_run
        self.stopped_by = stopped_by              # None, "time budget" or "first failure"
        self.shrink_stopped_by = shrink_stopped_by  # None, "time budget", "max_shrink_steps", "calling convention"
        self.coverage = coverage                  # (covered, total, missing) over the cases run
        self.seconds = seconds
        self.hints = list(hints)

    @property
    def counts(self):
        return {s: sum(c.status == s for c in self.cases) for s in STATUSES}

    @property
    def passed(self):
        """No case disagreed or erred, and at least one agreed (inconclusive cases neither pass nor fail)."""
        return not self.failures and any(c.passed for c in self.cases)

    @property
    def failures(self):
        return [c for c in self.cases if c.failed]

    @property
    def inconclusive(self):
        return [c for c in self.cases if c.status == "inconclusive"]

    def rows(self):
        """One dict per case: description, shape, dtype, status, the worst verdict row (tensor, error
        and bound measured the same way, norm, err/bound)."""
        out = []
        for i, c in enumerate(self.cases):
            row = c.worst_row()
            tensor, ratio = c.worst()
            out.append({"case": i, "description": c.case.describe(), "dtype": c.case.dtype,
                        "chunk_size": c.case.chunk_size, "lengths": list(c.case.lengths), "varlen": c.case.varlen,
                        "heads": c.case.heads, "batch": c.case.batch, "key_dim": c.case.key_dim,
                        "value_dim": c.case.value_dim, "scale": c.case.describe_scale(), "worst": tensor,
                        "norm": None if row is None else _norm_label(row),
                        "worst_error": None if row is None else row["error"],
                        "worst_bound": None if row is None else row["bound"], "ratio": ratio,
                        "status": c.status, "passed": c.passed, "error": c.error, "reasons": list(c.reasons),
                        "verdict_rows": [{k: r.get(k) for k in ("tensor", "error", "bound", "ratio", "index",
                                                                "agrees", "norm", "max_abs", "rms")}
                                         for r in (c.verdict.comparisons if c.verdict else [])]})
        return out

    def _summary(self):
        n = self.counts
        text = (f"{n['agree']} agree, {n['disagree']} disagree, {n['inconclusive']} inconclusive, "
                f"{n['error']} errors of {len(self.cases)} cases run")
        if self.cases_not_run:
            text += f"; {self.cases_not_run} not run ({self.stopped_by})"
        return text

    def verdict_table(self, result):
        """A case's verdict, each tensor's error measured as its bound is stated."""
        lines = [f"  {'tensor':7} {'measured as':11} {'error':>10} {'bound':>10} {'err/bound':>10}  "
                 f"{'worst at':22} {'verdict':9} {'max|Δ| entry':>12} {'rms':>10}"]
        for r in result.verdict.comparisons:
            ratio = "non-finite" if not r["finite"] else _g(_ratio(r))
            status = {"agree": "agree", "inconclusive": "INCONCL."}.get(r.get("status"), "DISAGREE")
            where = "(" + ", ".join(str(x) for x in (r.get("index") or [])) + ")"
            lines.append(f"  {r['tensor']:7} {_norm_label(r):11} {_g(r['error']):>10} "
                         f"{_g(r['bound']):>10} {ratio:>10}  {where[:22]:22} {status:9} {_g(r.get('max_abs')):>12} "
                         f"{_g(r.get('rms')):>10}")
        return "\n".join(lines)

    def __str__(self):
        lines = [f"check_kernel({self.kernel_name}): {'PASSED' if self.passed else 'FAILED'} — {self._summary()}"]
        lines.append(f"  {'#':>3} {'dtype':5} {'C':>3} {'shape':24} {'DK':>4} {'DV':>4} {'scale':12} "
                     f"{'regime':17} {'inputs':10} {'worst':6} {'measured':8} {'error':>9} {'bound':>9} "
                     f"{'err/bnd':>8}  verdict")
        for i, c in enumerate(self.cases):
            k = c.case
            shape = f"varlen{list(k.lengths)}xH{k.heads}" if k.varlen else f"B{k.batch}xH{k.heads}xL{k.lengths[0]}"
            row = c.worst_row()
            tensor, ratio = c.worst()
            regime = "+".join(_SHORT_REGIMES.get(r, r) for r in sorted(k.regimes)) or "normal"
            flags = " ".join(f for f, on in (("h0", k.h0), ("bwd", k.backward), ("dht", k.dht and k.backward)) if on)
            verdict = {"agree": "agree", "disagree": "DISAGREE", "inconclusive": "inconclusive",
                       "error": "ERROR"}[c.status]
            lines.append(f"  {i:>3} {k.dtype:5} {k.chunk_size:>3} {shape[:24]:24} {k.key_dim:>4} {k.value_dim:>4} "
                         f"{k.describe_scale()[:12]:12} {regime[:17]:17} {flags or '-':10} {str(tensor or '-'):6} "
                         f"{'-' if row is None else _norm_label(row):8} "
                         f"{_g(None if row is None else row['error']):>9} "
                         f"{_g(None if row is None else row['bound']):>9} {ratio:>8.3g}  {verdict}"
                         + (f"  ({c.error})" if c.error else ""))
        if self.coverage is not None:  # below the table: line 1 stays its header
            lines.append(f"pairs of attribute values covered by the cases run: {self.coverage[0]}/{self.coverage[1]}")
        if self.inconclusive:
            lines += ["", "inconclusive (outside a bound's premise):"]
            for c in self.inconclusive:
                lines.append(f"  #{self.cases.index(c)} {c.case.describe()}")
                lines += [f"    {reason}" for reason in c.reasons]
        if self.cases_not_run:
            lines += ["", f"{self.cases_not_run} of {self.cases_not_run + len(self.cases)} cases not run: "
                          f"{self.stopped_by}" + (f" of {self.settings.get('time_budget_s')} s spent"
                                                  if self.stopped_by == "time budget" else "")]
        errors = [c for c in self.cases if c.status == "error" and c.traceback]
        if errors:
            first = errors[0]
            lines += ["", f"the kernel's error in case #{self.cases.index(first)} ({first.error_kind}):",
                      first.traceback.rstrip()]
        lines += [""] + self.hints if self.hints else []
        if self.counterexample is not None:
            cx = self.counterexample
            why = {"calling convention": "a calling-convention error is not shrunk"}.get(
                self.shrink_stopped_by, f"shrinking stopped by {self.shrink_stopped_by}")
            if self.shrink_steps == 0 and (self.shrink_stopped_by or cx is self.first_failure):
                shrunk = "not shrunk" + (f": {why}" if self.shrink_stopped_by else "")
            else:
                shrunk = f"{self.shrink_steps} shrink steps" + (
                    f"; {why}, a smaller case may fail too" if self.shrink_stopped_by else "")
            lines += ["", f"smallest failing case ({shrunk}): {cx.case.describe()}"]
            if cx.error:
                lines.append(f"  {cx.error}")
            if cx.verdict is not None:
                lines.append(self.verdict_table(cx))
        return "\n".join(lines)

    def to_json(self):
        cx = self.counterexample
        return {"kernel": self.kernel_name, "settings": self.settings, "passed": self.passed, "counts": self.counts,
                "coverage": None if self.coverage is None else {
                    "covered": self.coverage[0], "total": self.coverage[1],
                    "missing": [[list(a), list(b)] for a, b in self.coverage[2]]},
                "cases_not_run": self.cases_not_run, "stopped_by": self.stopped_by,
                "shrink_stopped_by": self.shrink_stopped_by, "seconds": self.seconds, "hints": self.hints,
                "cases": [c.to_json() for c in self.cases],
                "counterexample": None if cx is None else {
                    **cx.to_json(),
                    "inputs": {k: (np.asarray(v, dtype=np.float64).tolist() if v is not None else None)
                               for k, v in inputs_of(cx.case).items()}},
                "first_failure": None if self.first_failure is None else self.first_failure.to_json(),
                "shrink_steps": self.shrink_steps}

    def dumps(self, **kw):
        return json.dumps(self.to_json(), default=str, **kw)


# ---------------------------------------------------------------------------------------------
# Progress

class _Progress:
    """One line per case on a terminal; once a run is long (an estimated 20 s or more), a bar with
    an ETA under the lines. Quiet when stderr is not a terminal or under pytest, unless forced."""

    def __init__(self, total, enabled, log):
        self.total, self.enabled, self.log = total, enabled, log
        self.stream = sys.stderr
        self.started = time.perf_counter()
        self.bar_shown = False

    def _clear_bar(self):
        if self.bar_shown:
            self.stream.write("\r\033[K")
            self.bar_shown = False

    def line(self, text):
        if self.log:
            self.log(text)
        if self.enabled:
            self._clear_bar()
            self.stream.write(text + "\n")
            self.stream.flush()

    def case(self, done, text):
        self.line(text)
        if not self.enabled or done >= self.total:
            return
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (self.total - done)
        if elapsed + eta >= 20:
            width = 30
            filled = int(width * done / self.total)
            self.stream.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} cases, "
                              f"{elapsed:.0f} s, ETA {eta:.0f} s")
            self.stream.flush()
            self.bar_shown = True

    def close(self):
        if self.enabled:
            self._clear_bar()
            self.stream.flush()


def _progress_wanted(progress):
    if progress is not None:
        return bool(progress)
    return "PYTEST_CURRENT_TEST" not in os.environ and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _hints(results):
    """Lines for the report where errors have one evident cause."""
    convention = [r for r in results if r.error_kind == "calling convention"]
    if not convention:
        return []
    default = [r for r in results if r.case.scale_mode == "default"]
    if default and all(r.case.scale_mode == "default" for r in convention) and \
            all(r.error_kind == "calling convention" for r in default):
        return [f"the kernel raised TypeError in every case that gave it scale=None ({len(default)}) and in no "
                "other: it does not take None, which fla's functions read as their default K^-1/2. Accept None "
                "(as K ** -0.5), or pass check_kernel a fixed scale=<number> to draw no default-scale cases."]
    return [f"{len(convention)} cases raised TypeError (listed as calling convention, not shrunk): the kernel's "
            "signature or the types it expects do not fit check_kernel's (see fn's documentation in "
            "check_kernel)."]
