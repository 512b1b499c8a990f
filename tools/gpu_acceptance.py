#!/usr/bin/env python3
"""The GPU acceptance run: every GPU path of moelab, through the `moelab` command as a user types it, on
whatever GPUs are present (1, 2, 4 or more), asserting outcomes and never timings.

Why a tool and not a CI job: CI has no GPU, and five paths broke on 2 and 4 GPUs that no CPU test could see
(the store on a supported duckdb, an interrupted --repeat, Hybrid-EP's backward, `model --from-run`, figures
beyond their own bound). This runs them all in one call, aiming at 10 minutes with the builds beside it (on
4 x H200 the whole run passed in one call of 555 s, on 2 x H200 in 460 s and on 2 x H100 in 568 s, builds
included: results/gpu-acceptance/h200x4, h200x2, h100x2),
and writes what it found to `<out>/summary.json` and `<out>/summary.md` (results/gpu-acceptance/<kind>/).

Steps, in order (each a `moelab` command, its exit code checked, its output searched for tracebacks):
  doctor          `moelab doctor --json`
  repeat-sigterm  `moelab run --backend nccl-a2a --repeat 3`, SIGTERM once its third start is running: the
                  finished starts must be stored (result rows), the run marked interrupted (multi-rank only)
  backends        `moelab backends --json` with the --backend-path folders: what can run here
  bench           one `moelab run` of every available backend, one job each: dispatch/combine at bf16 and
                  fp8 and the --sms counts (multi-rank only), and the MoE layer, serial and tbo, forward and
                  forward+backward, at the library's SMs (a suite crossing `bench = ["a2a", "e2e"]`)
  verify          `moelab verify` at the reference for the libraries present (multi-rank only), into its
                  own store, while the readers run beside it
  compare, report, model, check
                  on what the bench runs stored (CPU only)
Every stored case must be ok, or unsupported/skipped with its reason; no stored figure may be beyond its
own bound (a % of peak or bound above 100, an e2e ratio beyond its physical range) unless a flag names it.

DeepEP and Hybrid-EP come from `--backend-path NAME=DIR` folders built beforehand (the README's development
section has the commands); `--wait-for FILE` waits for a marker the build writes, so the steps that need no
library run while the libraries compile: the bench step first for the backends available before the build
(run acc-bench), then, once the marker is there, for the ones the build made available (acc-bench-lib,
without health snapshots: the first run proves that path, and two probes per backend job cost about 16 s).
A step that `--time-limit` leaves no time for is `cut`, and the verdict is then INCOMPLETE, not PASSED.

Example (2 or 4 GPUs):
  python tools/gpu_acceptance.py --out results/gpu-acceptance/h200x4 \\
      --backend-path deepep=build/ext/deepep-v1 --backend-path hybrid-ep=build/ext/hybrid-ep \\
      --nccl-tests-bin build/ext/nccl-tests/build/alltoall_perf --wait-for build/ext/BUILT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MOELAB = [sys.executable, "-m", "moelab.cli.main"]
MIN_STEP_S = 20.0  # a step is not started with less time than this left (--time-limit)
CHILDREN: set[int] = set()  # process groups of the moelab commands in flight


def stop_group(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """SIGTERM to the command's process group (moelab stores what finished), SIGKILL after `grace_s`: a
    step stopped by its limit or by a signal to the tool leaves nothing running on the GPUs (a run left
    behind measured as contention in the next call)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


LIBRARY_BACKENDS = ("deepep", "hybrid-ep", "nccl-tests")  # the ones `moelab verify` holds to their own tests
HOST_JOBS = ("nccl-tests",)  # timed by their own tool: no e2e layer
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
OK_STATUSES = ("ok",)
EXPLAINED_STATUSES = ("unsupported", "skipped")


@dataclass(kw_only=True)
class StepResult:
    name: str
    command: str
    status: str  # passed | failed | skipped | cut (not started: the --time-limit was spent)
    rc: int | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    output_tail: str = ""


@dataclass(kw_only=True)
class Settings:
    out: Path
    work: Path
    kind: str
    gpus: int
    cpu: bool
    backend_paths: dict[str, str]
    nccl_tests_bin: str | None
    wait_for: Path | None
    wait_timeout_s: float
    iters: int
    small: bool
    only: tuple[str, ...] = ()  # --backend: these of the available ones (empty: every one)
    sms: str = "default"  # the a2a run's SM counts
    time_limit_s: float | None = None  # --time-limit: steps that would start past it are skipped, said so

    @property
    def db(self) -> Path:
        return self.work / "moelab.duckdb"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    @property
    def verify_db(self) -> Path:
        """verify's own store: it writes while the readers read the bench store beside it (DuckDB lets no
        reader open a file another process writes)."""
        return self.work / "verify.duckdb"

    def store_args(self) -> list[str]:
        return ["--db", str(self.db), "--out", str(self.runs)]

    def verify_store_args(self) -> list[str]:
        return ["--db", str(self.verify_db), "--out", str(self.work / "runs-verify")]

    def path_args(self, names: Sequence[str] | None = None) -> list[str]:
        out = []
        for name, path in self.backend_paths.items():
            if names is None or name in names:
                out += ["--backend-path", f"{name}={path}"]
        return out

    def launch_args(self) -> list[str]:
        return ["--cpu", "--gpus", str(self.gpus)] if self.cpu else ["--gpus", str(self.gpus)]

    @property
    def experts_per_rank(self) -> int:
        """The reference workload at its real shape from 4 ranks (2 experts per rank), else the 8-per-rank
        variant (2 x ranks < topk 8)."""
        return 2 if self.gpus >= 4 else 8

    @property
    def hidden_tokens(self) -> tuple[int, int]:
        """The reference's hidden size and tokens per rank; `--small` (CPU ranks) shrinks them to what gloo
        moves in seconds."""
        return (256, 128) if self.small else (8192, 4096)

    def workload_args(self) -> list[str]:
        """The flags that set it where the suite's reference workload is not it already."""
        args = ["--experts-per-rank", str(self.experts_per_rank)]
        if self.small:
            hidden, tokens = self.hidden_tokens
            args += ["--hidden", str(hidden), "--tokens-per-rank", str(tokens)]
        return args

    def nccl_tests_args(self, backends: Sequence[str]) -> list[str]:
        return (
            ["--nccl-tests-bin", self.nccl_tests_bin]
            if self.nccl_tests_bin and "nccl-tests" in backends
            else []
        )


class Runner:
    """Runs steps, keeps their results, and writes the summary after each (a killed call keeps what ran)."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.results: list[StepResult] = []
        self.started = time.monotonic()
        self.facts: dict[str, Any] = {}
        self.lock = threading.Lock()  # verify's thread and the readers record side by side

    def command(
        self,
        name: str,
        argv: list[str],
        *,
        expect: Sequence[int] = (0,),
        timeout_s: float = 300.0,
        check: Callable[[StepResult, str], None] | None = None,
    ) -> StepResult:
        """One `moelab` command: its exit code in `expect`, no traceback in its output, then `check`."""
        t0 = time.monotonic()
        shown = " ".join(["moelab", *argv])
        res = StepResult(name=name, command=shown, status="passed")
        log = self.s.out / f"{name}.log"
        left = self.remaining()
        if left < MIN_STEP_S:
            res.status, res.command = "cut", shown
            res.notes.append(f"not run: the time limit (--time-limit {self.s.time_limit_s:.0f} s) is spent")
            return self.record(res)
        limit = min(timeout_s, left)
        proc = subprocess.Popen(
            [*MOELAB, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            start_new_session=True,  # its own process group: stopped whole, torchrun's ranks included
        )
        CHILDREN.add(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=limit)
            res.rc = proc.returncode
        except subprocess.TimeoutExpired:
            stop_group(proc)
            stdout, stderr = proc.communicate()
            if limit < timeout_s:  # the call's time ran out, not the step's own: what it proves is unshown
                res.status = "cut"
                res.notes.append(
                    f"stopped after {limit:.0f} s: the time limit (--time-limit {self.s.time_limit_s:.0f} s) "
                    "was reached (stopped, with every process it started)"
                )
            else:
                res.problems.append(
                    f"did not finish in {limit:.0f} s (stopped, with every process it started)"
                )
        finally:
            CHILDREN.discard(proc.pid)
        output = stdout + stderr
        log.write_text(f"$ {shown}\n{output}")
        res.seconds = time.monotonic() - t0
        res.output_tail = output[-1500:]
        if res.status == "cut":  # stopped by the time limit: its exit code and output judge nothing
            return self.record(res)
        if res.rc is not None and res.rc not in expect:
            res.problems.append(f"exit code {res.rc}, expected {' or '.join(map(str, expect))}")
        if TRACEBACK.search(output):
            res.problems.append("a traceback in its output")
        if check is not None and not res.problems:
            try:
                check(res, stdout)  # what the command printed for a reader (notes go to stderr)
            except Exception as exc:  # a check that cannot read what it checks is a finding, not a crash
                res.problems.append(f"its check failed: {type(exc).__name__}: {exc}")
        return self.record(res)

    def passed(self) -> bool:
        """Every step passed or was skipped for a reason of the machine (one GPU, no library): a step the
        time limit cut is not a pass, since what it proves was not shown."""
        return all(r.status in ("passed", "skipped") for r in self.results)

    def verdict(self) -> str:
        if any(r.status == "failed" for r in self.results):
            return "FAILED"
        return "PASSED" if self.passed() else "INCOMPLETE"

    def remaining(self) -> float:
        if self.s.time_limit_s is None:
            return float("inf")
        return self.s.time_limit_s - (time.monotonic() - self.started)

    def skip(self, name: str, why: str) -> StepResult:
        return self.record(StepResult(name=name, command="", status="skipped", notes=[why]))

    def record(self, res: StepResult) -> StepResult:
        if res.problems:
            res.status = "failed"
        with self.lock:
            self.results.append(res)
            self.write_summary()
            mark = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip", "cut": "CUT "}[res.status]
            print(
                f"[{mark}] {res.name} ({res.seconds:.0f} s) {'; '.join(res.problems + res.notes)}", flush=True
            )
        return res

    def write_summary(self) -> None:
        summary = {
            "kind": self.s.kind,
            "gpus": self.s.gpus,
            "device": "cpu" if self.s.cpu else "cuda",
            "passed": self.passed(),
            "verdict": self.verdict(),
            "wall_s": round(time.monotonic() - self.started, 1),
            "facts": self.facts,
            "steps": [asdict(r) for r in self.results],
        }
        (self.s.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        (self.s.out / "summary.md").write_text(markdown(summary))


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


NCCL_TESTS_DIR: list[str] = []  # --nccl-tests-bin's folder: on PATH, so `moelab backends` finds alltoall_perf


def child_env() -> dict[str, str]:
    """The environment of every command: multicast off (the lent machines' rule), output unbuffered, the
    nccl-tests build on PATH (as a user who built it has it)."""
    env = dict(os.environ)
    if NCCL_TESTS_DIR:
        env["PATH"] = os.pathsep.join([*NCCL_TESTS_DIR, env.get("PATH", "")])
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "160")
    return env


def markdown(summary: dict[str, Any]) -> str:
    verdict = summary["verdict"]
    lines = [
        f"# GPU acceptance: {summary['kind']} ({summary['gpus']} {summary['device']} ranks): {verdict}",
        "",
        f"Wall time {summary['wall_s']:.0f} s. Made by `tools/gpu_acceptance.py`; every step is a `moelab` "
        "command, judged by its exit code, what it stored and the absence of tracebacks, never by timings.",
        "",
    ]
    for k, v in summary["facts"].items():
        lines.append(f"- {k}: {v}")
    lines += ["", "| step | result | s | exit | what it found |", "|---|---|---|---|---|"]
    for r in summary["steps"]:
        found = "; ".join(r["problems"] + r["notes"]).replace("|", "\\|") or "—"
        lines.append(
            f"| {r['name']} | {r['status']} | {r['seconds']:.0f} | {'' if r['rc'] is None else r['rc']} | {found} |"
        )
    lines += ["", "## Commands", ""]
    lines += [f"- `{r['name']}`: `{r['command']}`" for r in summary["steps"] if r["command"]]
    failed = [r for r in summary["steps"] if r["status"] == "failed"]
    if failed:
        lines += ["", "## What failed, with the end of its output", ""]
        for r in failed:
            lines += [f"### {r['name']}", "", "```", r["output_tail"].strip()[-1200:], "```", ""]
    return "\n".join(lines) + "\n"


# ----- what the store must hold -------------------------------------------------------------------------


def query(db: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def check_cases(res: StepResult, db: Path, run_id: str) -> None:
    """Every case ok, or unsupported/skipped with its reason; at least one measured; judged views readable."""
    rows = query(db, "SELECT backend, case_id, status, reason FROM cases WHERE run_id = ?", [run_id])
    if not rows:
        res.problems.append(f"run {run_id}: no case stored")
        return
    counts: dict[str, int] = {}
    for backend, case_id, status, reason in rows:
        counts[status] = counts.get(status, 0) + 1
        if status in EXPLAINED_STATUSES and not reason:
            res.problems.append(f"{backend} {case_id}: {status} without a reason")
        elif status not in OK_STATUSES + EXPLAINED_STATUSES:
            res.problems.append(f"{backend} {case_id}: {status}: {(reason or '')[:300]}")
    res.notes.append("cases " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if not counts.get("ok"):
        res.problems.append(f"run {run_id}: nothing measured")
    # the views judging, compare, report and model read (broken on duckdb 1.4 by a stale binding)
    judged = query(db, "SELECT count(*) FROM results_judged WHERE run_id = ?", [run_id])[0][0]
    res.notes.append(f"{judged} result rows")
    for backend, case_id, status, reason in rows:
        if status == "unsupported":
            res.notes.append(f"unsupported {backend} {case_id}: {(reason or '')[:160]}")


def beyond_bound(db: Path, run_id: str) -> list[str]:
    """Figures beyond their own bound that no flag names: % of peak or bound above 100 in the run view the
    console and report show, and e2e ratios outside their physical range."""
    import duckdb

    from moelab.measure.e2e.metrics import BOUNDED
    from moelab.reports.run_view import load_view

    problems: list[str] = []
    con = duckdb.connect(str(db), read_only=True)
    try:
        view = load_view(con, run_id)
    finally:
        con.close()
    flagged = [(item.where, g.kind) for g in view.flag_groups for item in g.items]
    for r in view.results:
        for key, value in r.items():
            if not key.startswith("frac_") or not isinstance(value, int | float) or value <= 1.0:
                continue
            named = any(r["backend"] in where and r["case_id"] in where for where, _ in flagged)
            if not named:
                problems.append(
                    f"{r['backend']} {r['case_id']} {r['op']}: {key} = {100 * value:.1f}% with no flag naming it"
                )
    rows = query(
        db,
        "SELECT c.backend, c.case_id, m.name, m.value, m.definition FROM case_metrics m JOIN cases c "
        "USING (run_id, case_id, backend) WHERE m.run_id = ?",
        [run_id],
    )
    for backend, case_id, name, value, _ in rows:
        bounded = BOUNDED.get(name)  # the range the metric's own definition declares (MetricDef.outside)
        outside = bounded.outside(value) if bounded is not None else None
        if outside:
            problems.append(f"{backend} {case_id}: {name} {outside}")
    return problems


# ----- the steps ----------------------------------------------------------------------------------------


def doctor_note(out: str) -> str:
    """What `moelab doctor --json` found: its worst status and the checks that reached it (the summary
    printed "verdict ?" on both GPU kinds: the report's key is `worst`)."""
    report = json.loads(out[out.index("{") :])
    worst = report["worst"]
    found = [*report.get("findings", []), *report.get("cluster", [])]  # each node's, then across nodes
    checks = sorted({f["check"] for f in found if f.get("status") == worst})
    return f"worst {worst}" + (f": {', '.join(checks)}" if checks and worst != "pass" else "")


def step_doctor(r: Runner) -> None:
    # doctor's own exit code says whether the machine is healthy (1 = a finding): outcome, not crash
    def check(res: StepResult, out: str) -> None:
        res.notes.append(doctor_note(out))

    r.command("doctor", ["doctor", "--json"], expect=(0, 1), timeout_s=120, check=None if r.s.cpu else check)


def step_repeat_sigterm(r: Runner) -> None:
    """--repeat 3 stopped by SIGTERM once its third start runs: the two finished starts stay stored."""
    s = r.s
    run_id = "acc-repeat"
    argv = [
        "run",
        "--backend",
        "nccl-a2a",
        "--repeat",
        "3",
        "--sms",
        "default",
        "--iters",
        str(s.iters),
        "--warmup",
        "2",
        "--run-id",
        run_id,
        "--no-health",
        *s.launch_args(),
        *s.workload_args(),
        *s.store_args(),
    ]
    shown = " ".join(["moelab", *argv])
    res = StepResult(name="repeat-sigterm", command=shown, status="passed")
    t0 = time.monotonic()
    third = s.runs / run_id / "nccl-a2a" / "r2"
    proc = subprocess.Popen(
        [*MOELAB, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    CHILDREN.add(proc.pid)
    deadline = t0 + 300
    while proc.poll() is None and not third.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is not None:
        res.problems.append(f"the run ended (exit {proc.returncode}) before its third start began")
    elif not third.exists():
        res.problems.append("the third start did not begin in 300 s")
    else:
        time.sleep(2.0)  # inside the third start, as a user's Ctrl-C or a scheduler's preemption comes
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace_s=0.0)
        out, _ = proc.communicate()
        res.problems.append("did not stop within 180 s of SIGTERM")
    CHILDREN.discard(proc.pid)
    res.rc = proc.returncode
    res.seconds = time.monotonic() - t0
    (s.out / "repeat-sigterm.log").write_text(f"$ {shown}\n{out}")
    res.output_tail = out[-1500:]
    if TRACEBACK.search(out):
        res.problems.append("a traceback in its output")
    if res.rc != 128 + signal.SIGTERM and not res.problems:
        res.problems.append(f"exit code {res.rc}, expected {128 + signal.SIGTERM} (interrupted by SIGTERM)")
    if s.db.exists():
        stored = query(s.db, "SELECT count(*) FROM results WHERE run_id = ?", [run_id])[0][0]
        status = query(s.db, "SELECT status FROM runs WHERE run_id = ?", [run_id])
        res.notes.append(f"{stored} result rows stored; run status {status[0][0] if status else 'missing'}")
        if not stored:
            res.problems.append("the finished starts were not stored (0 result rows)")
    else:
        res.problems.append("no database written")
    r.record(res)


def step_backends(r: Runner, name: str = "backends") -> list[str]:
    """The backends that can run here, with the --backend-path folders."""
    found: list[str] = []

    def check(res: StepResult, out: str) -> None:
        rows = json.loads(out[out.index("[") :])
        for row in rows:
            if row["available"]:
                found.append(row["name"])
            else:
                res.notes.append(f"{row['name']} unavailable: {(row['reason'] or '')[:140]}")
        r.facts["available backends"] = ", ".join(found)

    r.command(name, ["backends", "--json", *r.s.path_args()], timeout_s=180, check=check)
    return found


def runnable(available: Sequence[str], only: Sequence[str]) -> list[str]:
    """What the runs take: every available backend (or those of --backend), but the test-only plugins
    tests/plugins registers."""
    return [b for b in available if not b.startswith("test-") and (not only or b in only)]


def measuring_run(r: Runner, name: str, run_id: str, argv: list[str], timeout_s: float) -> str | None:
    """A `moelab run` step: exit 0, then every stored case explained and no figure beyond its bound; the run
    id when it passed, for the readers."""

    def check(res: StepResult, out: str) -> None:
        check_cases(res, r.s.db, run_id)
        res.problems += beyond_bound(r.s.db, run_id)

    res = r.command(name, argv, expect=(0,), timeout_s=timeout_s, check=check)
    return run_id if res.rc == 0 else None


E2E_PAYLOAD = {"deepep": ("fp8",), "mxfp8-a2a": ("bf16", "mxfp8")}  # DeepEP V1 traps on bf16 at hidden 8192


def bench_suite(path: Path, backends: Sequence[str], s: Settings, a2a: bool) -> None:
    """One suite for both benchmarks, so each backend runs one job (a job start costs about 12 s on a GPU):
    dispatch/combine (`bench = "a2a"`, at the --sms counts) and the MoE layer (serial and tbo, forward and
    forward+backward, library-default SMs); bf16 and fp8 where the backend has them, DeepEP V1 at fp8.
    Without `a2a` (one rank) only the layer."""
    hidden, tokens = s.hidden_tokens
    sms: list[str | int] = [
        v if v == "default" else int(v) for v in (x.strip() for x in s.sms.split(",")) if v
    ]
    toml = json.dumps  # strings, numbers, booleans and lists of them are written alike in both
    lines = [
        'name = "gpu-acceptance"',
        'description = "dispatch/combine and the MoE layer of every backend (tools/gpu_acceptance.py)"',
        "",
        "[workload]",
        f"hidden = {hidden}",
        f"tokens_per_rank = {tokens}",
        "topk = 8",
        f"experts_per_rank = {s.experts_per_rank}",
        'routing = "uniform"',
        "seed = 0",
        "",
        "[axes]",
        f"sms = {toml(sms)}",
    ]
    for b in backends:
        layer = b not in HOST_JOBS
        benches = (["a2a"] if a2a else []) + (["e2e"] if layer else [])
        if not benches:
            continue
        lines += ["", f"[backend.{b}.axes]", f"bench = {toml(benches)}"]
        lines += [f"dtype = {toml(list(E2E_PAYLOAD.get(b, ('bf16', 'fp8'))))}"]
        if layer:
            lines += [f"mode = {toml(['serial', 'tbo'])}", f"backward = {toml([False, True])}"]
    for v in sms:
        if v != "default":  # the layer at the library's default SMs only
            lines += ["", "[[exclude]]", 'bench = "e2e"', f"sms = {toml(v)}"]
    path.write_text("\n".join(lines) + "\n")


def step_bench(r: Runner, backends: Sequence[str], run_id: str, name: str, health: bool) -> str | None:
    """One `moelab run` of every backend's dispatch/combine and MoE layer cases; `health` off in the
    second phase, whose snapshots the first proved (two probes per backend job)."""
    s = r.s
    multi = s.gpus >= 2
    suite = s.work / f"{run_id}.toml"
    bench_suite(suite, backends, s, a2a=multi)
    runs = [b for b in backends if multi or b not in HOST_JOBS]
    if not runs:
        r.skip(name, f"no backend here runs on one rank ({', '.join(backends) or 'none available'})")
        return None
    argv = [
        "run",
        "--suite",
        str(suite),
        "--backend",
        ",".join(runs),
        "--iters",
        str(max(3, s.iters // 2)),  # outcomes: correctness is checked on every iteration
        "--warmup",
        "2",
        "--run-id",
        run_id,
        "--label",
        "acceptance",  # one label for both phases; a label may not be a run id
        "--timeout",
        "300",
        *([] if health else ["--no-health"]),
        *s.launch_args(),
        *s.path_args(runs),
        *s.nccl_tests_args(runs),
        *s.store_args(),
    ]
    return measuring_run(r, name, run_id, argv, timeout_s=540)


def step_verify(r: Runner, backends: Sequence[str]) -> None:
    s = r.s
    libs = [b for b in LIBRARY_BACKENDS if b in backends]
    if not libs:
        r.skip(
            "verify", "no library with its own benchmark is available here (deepep, hybrid-ep, nccl-tests)"
        )
        return
    argv = [
        "verify",
        "--backend",
        ",".join(libs),
        "--experts-per-rank",
        str(s.experts_per_rank),
        "--label",
        "acc-verify",
        "--timeout",
        "200",
        "--library-timeout",
        "200",
        "--no-health",
        *s.path_args(libs),
        *s.nccl_tests_args(libs),
        *s.verify_store_args(),
    ]
    # verify's exit code 1 says a figure is outside ±5% of the library's: a finding it reports, not a crash
    r.command("verify", argv, expect=(0, 1), timeout_s=420)


def step_readers(r: Runner, run_ids: Sequence[str], baseline: str | None) -> None:
    """compare, report, model --from-run and check on what the runs stored (the runs of both phases
    together where the libraries built while the first ran)."""
    s = r.s
    db = ["--db", str(s.db)]
    runs = ",".join(run_ids)
    r.command("compare", ["compare", "--run", runs, *db], timeout_s=120)
    report = s.work / "report.html"

    def report_written(res: StepResult, out: str) -> None:
        if not report.exists() or report.stat().st_size < 1000:
            res.problems.append(f"{report} not written")

    r.command(
        "report", ["report", "--run", runs, "-o", str(report), *db], timeout_s=180, check=report_written
    )

    def model_json(res: StepResult, out: str) -> None:
        json.loads(out)  # the whole output is one JSON document

    r.command("model", ["model", "--from-run", run_ids[-1], "--json", *db], timeout_s=120, check=model_json)
    # the gate on real samples: the interrupted repeat run (same workload, nccl-a2a, minutes earlier, same
    # code) as the baseline. 0 pass, 3 cannot judge (noise too wide), 4 not judged (contended); a regression
    # verdict (1) between the same code minutes apart is a false alarm, a finding
    if baseline:
        r.command(
            "check",
            ["check", "--run", run_ids[0], "--baseline", baseline, *db],
            expect=(0, 3, 4),
            timeout_s=120,
        )
    else:
        r.skip(
            "check", "no second run of the same cases stored to check against (the repeat step did not run)"
        )


def wait_for_builds(r: Runner) -> None:
    s = r.s
    if s.wait_for is None:
        return
    t0 = time.monotonic()
    while not s.wait_for.exists() and time.monotonic() - t0 < s.wait_timeout_s:
        time.sleep(2.0)
    waited = time.monotonic() - t0
    note = f"waited {waited:.0f} s for {s.wait_for}"
    if s.wait_for.exists():
        r.facts["builds"] = f"{note}: {s.wait_for.read_text().strip()[:300]}"
    else:
        r.facts["builds"] = f"{note}: not there after {s.wait_timeout_s:.0f} s"


def gpu_facts(r: Runner) -> None:
    r.facts["python"] = platform.python_version()
    try:
        import duckdb
        import torch

        r.facts["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
        r.facts["duckdb"] = duckdb.__version__
        if torch.cuda.is_available() and not r.s.cpu:
            names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
            r.facts["gpus"] = f"{torch.cuda.device_count()} × {', '.join(sorted(names))}"
            r.facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # facts are for the reader; a missing one is said, not fatal
        r.facts["facts error"] = repr(exc)


def run_all(s: Settings, keep: list[Runner] | None = None) -> Runner:
    """The steps in order. With --wait-for and the libraries still compiling, the backends that need no
    build run first (run acc-bench), and the built ones after the wait (acc-bench-lib, same label): the
    call's ten minutes hold the builds and the steps."""
    r = Runner(s)
    if keep is not None:
        keep.append(r)
    gpu_facts(r)
    multi = s.gpus >= 2
    why_single = "needs at least 2 ranks: one GPU moves nothing over a link (this machine has 1)"
    step_doctor(r)
    if multi:
        step_repeat_sigterm(r)
    else:
        r.skip("repeat-sigterm", why_single)
        r.skip("a2a", f"dispatch/combine {why_single}; the MoE layer runs")
    runs: list[str | None] = []  # the bench run of each phase, where it passed
    building = s.wait_for is not None and not s.wait_for.exists()
    done: list[str] = []
    if building:
        done = runnable(step_backends(r, "backends-before-build"), s.only)
        runs.append(step_bench(r, done, "acc-bench", "bench", health=True))
        wait_for_builds(r)
    backends = [b for b in runnable(step_backends(r), s.only) if b not in done]
    if backends or not building:
        suffix = "-lib" if building else ""
        runs.append(step_bench(r, backends, f"acc-bench{suffix}", f"bench{suffix}", health=not building))
    # verify (GPUs, its own store) and the readers (CPU, the bench store) side by side: verify holds the
    # library's own test (Hybrid-EP's alone took 124 s on 2 x H200), and the readers after it did not fit
    # the call's ten minutes
    verify: threading.Thread | None = None
    if multi:
        verify = threading.Thread(target=step_verify, args=(r, [*done, *backends]), name="verify")
        verify.start()
    else:
        r.skip("verify", "each library's own test needs at least 2 ranks")
    stored = [x for x in runs if x]
    if stored:
        # the gate holds the first run (nccl-a2a's dispatch/combine is in it) against the repeat run
        step_readers(r, stored, "acc-repeat" if multi else None)
    if verify is not None:
        verify.join()
    return r


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--out", type=Path, required=True, help="folder for summary.json, summary.md and each step's log"
    )
    p.add_argument(
        "--work", type=Path, default=Path("/tmp/moelab-acceptance"), help="database and run directories"
    )
    p.add_argument(
        "--kind", default=None, help="name of the machine kind in the summary (default: from the GPUs)"
    )
    p.add_argument("--gpus", type=int, default=None, help="ranks (default: every visible GPU)")
    p.add_argument("--cpu", action="store_true", help="CPU ranks over gloo (to try the tool without a GPU)")
    p.add_argument(
        "--small", action="store_true", help="a small workload (hidden 256, 128 tokens): CPU ranks"
    )
    p.add_argument("--backend-path", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--nccl-tests-bin", default=None, metavar="PATH")
    p.add_argument("--wait-for", type=Path, default=None, metavar="FILE", help="wait for this build marker")
    p.add_argument("--wait-timeout", type=float, default=330.0, metavar="SECONDS")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per op (outcomes, not timings)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="skip the steps that would start past it",
    )
    p.add_argument("--sms", default="default", metavar="N|default[,…]", help="the a2a run's SM counts")
    p.add_argument(
        "--backend", default="", metavar="NAME[,NAME…]", help="only these of the available backends"
    )
    a = p.parse_args(argv)
    for v in a.sms.split(","):
        if v.strip() != "default" and not v.strip().isdigit():
            p.error(f"--sms takes default or whole numbers of SMs, comma-separated, got {v.strip()!r}")
    paths: dict[str, str] = {}
    for v in a.backend_path:
        name, sep, path = v.partition("=")
        if not sep:
            p.error(f"--backend-path takes NAME=DIR, got {v!r}")
        paths[name] = str(Path(path).resolve())
    if a.nccl_tests_bin:
        found = Path(a.nccl_tests_bin)
        NCCL_TESTS_DIR[:] = [str((found if found.is_dir() else found.parent).resolve())]
    gpus = a.gpus
    if gpus is None:
        gpus = 2 if a.cpu else visible_gpus()
    kind = a.kind or default_kind(gpus, a.cpu)
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    return Settings(
        out=a.out,
        work=a.work,
        kind=kind,
        gpus=gpus,
        cpu=a.cpu,
        backend_paths=paths,
        nccl_tests_bin=a.nccl_tests_bin,
        wait_for=a.wait_for,
        wait_timeout_s=a.wait_timeout,
        iters=a.iters,
        small=a.small or a.cpu,
        only=tuple(b for b in a.backend.split(",") if b),
        sms=a.sms,
        time_limit_s=a.time_limit,
    )


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def default_kind(gpus: int, cpu: bool) -> str:
    if cpu:
        return f"cpu-x{gpus}"
    try:
        import torch

        name = torch.cuda.get_device_name(0)
        gen = next((g for g in ("H200", "H100", "B200", "A100") if g in name), name.split()[-1])
        return f"{gen.lower()}x{gpus}"
    except Exception:
        return f"gpu-x{gpus}"


def main(argv: Sequence[str] | None = None) -> int:
    s = parse_args(argv)
    if s.gpus < 1:
        print("error: no GPU visible: run with --cpu to try the tool on CPU ranks", file=sys.stderr)
        return 2
    runner: list[Runner] = []

    def stopped(signum: int, _frame: object) -> None:
        for pid in list(CHILDREN):  # each command leads its own process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        time.sleep(5.0)
        for pid in list(CHILDREN):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if runner:
            runner[0].facts["stopped"] = f"by {signal.Signals(signum).name}: the steps after it did not run"
            runner[0].write_summary()
        print(f"stopped by {signal.Signals(signum).name}: {s.out / 'summary.md'}", file=sys.stderr)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stopped)
    r = run_all(s, runner)
    passed = r.passed()
    print(f"{r.verdict()}: {s.out / 'summary.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
