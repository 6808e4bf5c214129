"""A slice of JAX's own test suite on stock XLA and on xla-vmm, side by side (GPU machine).

    python3 integration/jax_tests.py --tests DIR [--files api_test,lax_test] [--platforms cuda,vmm]
        [--out OUT] [--jobs 6] [--budget-s 400] [--file-timeout-s 300] [-k EXPR] [--vmm-lib SO]
        [--ref-from OLD.json.gz] [--resume-from OLD.json.gz]

DIR holds JAX's `tests/*.py` of the installed jax's version (`JAX_SRC=<jax git dir> stage_gpu.sh
--perf` exports them). Every (platform, file) pair runs in its own pytest process: `cuda` is stock
(JAX_PLATFORMS=cuda,cpu), `vmm` is the plugin (JAX_PLATFORMS=vmm,cpu, --vmm-lib); JAX's generated
test cases at JAX_NUM_GENERATED_CASES (default 2 here, 10 in JAX). A test that kills its
process (a signal, an abort) or hangs past the file's time is recorded as `died` with the process's
last words, and pytest starts again on the tests not yet run (integration/jaxslice/plugin.py logs
each test's start and outcome), so one crash costs one test, not the rest of the file.

Writes OUT/jax_tests.json (every test's outcome per platform, deaths, fallback warnings) and
OUT/jax_tests.md: per file, stock vs vmm counts, deaths, and the tests that pass on stock but not on
vmm grouped by their error. --budget-s: no process starts once that many seconds have passed (a file
cut short says so). Over several calls: --ref-from reuses an earlier call's stock results (stock does
not change with our code), --resume-from an earlier call's results of the same code (finished files
reused, cut ones continued from where they stopped). Exit status 0 when the table was written,
whatever the tests did.
"""
import argparse
import collections
import concurrent.futures
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILES = ("api_test,lax_control_flow_test,lax_test,lax_autodiff_test,lax_numpy_test,random_test,"
                 "nn_test,array_test,memories_test,python_callback_test,buffer_callback_test,"
                 "debugging_primitives_test,pjit_test,"
                 # Linear algebra, FFT, scipy and more numpy (solver custom calls, FFT thunks, conditionals).
                 "linalg_test,fft_test,scipy_fft_test,scipy_signal_test,lax_scipy_test,scipy_stats_test,"
                 "lax_numpy_reducers_test,lax_numpy_indexing_test,custom_linear_solve_test,checkify_test")
# How report() says a program runs (integration/jax_plugins/xla_vmm/_stats.py).
GRAPH_RUNNERS = ("va-stable graph", "graph-recapture")
# How the pytest plugin (jaxslice/plugin.py, guard_choice) says the guard chose eager for a program.
GUARD_CHOICE = "guard: eager measured fastest"
# Lines of the plugin's log that say a program left our runtime (counted per file).
FALLBACK_RE = re.compile(r"vendor runtime|falls back to the vendor|on the vendor fallback", re.I)
# The plugin's warning for a program its runtime rejected: the program and why.
REJECTED_RE = re.compile(r"rejected (\S+) \((.*)\); it runs on the vendor runtime")


# What integration/jaxslice/plugin.py prints before each test.
START_MARKER = "##jaxslice-start "
# Tests named per fallback reason and file (the first ones seen).
FALLBACK_EXAMPLES = 5


def fallbacks_in(text):
    """(fallback warning lines, Counter of their reasons, {reason: [tests]}) in a test process's
    output. A reason is what our runtime rejected, without the thunk's own name and numbers (`custom
    call 'xla_ffi_python_gpu_callback'`, `host_execute_start thunk '…': ...`); its tests are the ones
    running when the warnings came (the plugin prints a marker before each), first ones first."""
    n, reasons, tests, current = 0, collections.Counter(), {}, None
    for ln in text.splitlines():
        if ln.startswith(START_MARKER):
            current = ln[len(START_MARKER):].strip()
            continue
        if not FALLBACK_RE.search(ln):
            continue
        n += 1
        m = REJECTED_RE.search(ln)
        why = m.group(2) if m else "other: " + ln.strip()
        why = re.sub(r"^(loading \S+ on device \d+: )", "", why)
        why = re.sub(r"(thunk|kernel|copy) '[^']*'", r"\1 '…'", why)
        why = normalize(why)
        reasons[why] += 1
        named = tests.setdefault(why, [])
        if current and current not in named and len(named) < FALLBACK_EXAMPLES:
            named.append(current)
    return n, reasons, tests


def add_tests(into, more):
    """Merge {reason: [tests]} `more` into `into`, keeping at most FALLBACK_EXAMPLES per reason."""
    for why, ids in more.items():
        named = into.setdefault(why, [])
        named += [t for t in ids if t not in named][:max(0, FALLBACK_EXAMPLES - len(named))]
MAX_RESTARTS = 40
# The longest files, split over several processes so that the slice ends within one device call.
DEFAULT_SHARDS = "api_test=4,lax_test=3,lax_control_flow_test=3,lax_numpy_test=2"


def platform_env(platform, base, vmm_lib):
    """The environment of one platform's processes: the GPU backend plus `cpu` (which JAX's tests and
    host callbacks use), as JAX's own CI runs them."""
    env = dict(base)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("JAX_NUM_GENERATED_CASES", "2")
    # A dying process says where: Python's stack on SIGSEGV / SIGABRT, Rust's on a panic.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.setdefault("RUST_BACKTRACE", "1")
    # ... and the plugin's native stack on a fatal signal (plugin/src/cabi/crash.rs).
    env.setdefault("XLA_VMM_CRASH_REPORT", "1")
    env["JAX_PLATFORMS"] = platform + ",cpu"
    paths = [os.path.join(HERE, "jaxslice")]
    if platform == "vmm":
        env["XLA_VMM_LIBRARY"] = vmm_lib
        env["JAXSLICE_PROGRAMS"] = "1"
        paths.append(HERE)  # jax_plugins/xla_vmm
    else:
        env["XLA_VMM_LIBRARY"] = "/nonexistent"
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [base.get("PYTHONPATH")] if p])
    return env


def json_lines(path):
    """The JSON records of a plugin log, in order (a line cut by a process's death is skipped)."""
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue


def read_programs(path):
    """{program key: [name, runner, reason, first test]} from a plugin log's program lines (the last
    line of a program says how it ran last)."""
    out = {}
    for rec in json_lines(path):
        if "prog" in rec:
            first = out.get(rec["prog"], [None] * 4)[3] or rec.get("test")
            out[rec["prog"]] = [rec.get("program"), rec.get("runner"), rec.get("reason"), first]
    return out


def read_log(path):
    """(outcomes: id -> (outcome, msg), started ids in order) from a plugin log."""
    outcomes, started = {}, []
    for rec in json_lines(path):
        if "start" in rec:
            started.append(rec["start"])
        elif "id" in rec:
            outcomes[rec["id"]] = (rec["outcome"], rec.get("msg", ""))
    return outcomes, started


def last_words(text, n=16):
    """What a dead process said about its death: from the first abort / signal / check line on
    (its stack, as absl's failure handler and Python's faulthandler print it), at most n lines;
    else its last n lines."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    # The plugin's native stack (XLA_VMM_CRASH_REPORT), whole, ahead of the rest.
    report = next((i for i, ln in enumerate(lines) if "xla-vmm crash report: signal" in ln), None)
    if report is not None:
        end = next((i for i in range(report, len(lines)) if "end of xla-vmm crash report" in lines[i]),
                   len(lines) - 1)
        return lines[report:end + 1] + last_words("\n".join(lines[end + 1:]), n)
    key = re.compile(r"abort|panick|Fatal|SIGSEGV|SIGABRT|Segmentation|core dumped|Check failed|"
                     r"terminate called|what\(\)")
    first = next((i for i, ln in enumerate(lines) if key.search(ln)), None)
    return lines[first:first + n] if first is not None else lines[-n:]


def died_reason(rc, hung):
    if hung:
        return "hung (killed at the file's time limit)"
    if rc < 0:
        try:
            return "killed by " + signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "process exited with status %d" % rc


def seed(log, skip, earlier):
    """Start a file's log and skip list from an earlier call's result of the same file (one cut
    short by its budget): its outcomes count, and its tests are not run again."""
    for p in (log, skip):
        if os.path.exists(p):
            os.remove(p)
    if not earlier:
        return [], 0, collections.Counter(), {}
    with open(log, "w", encoding="utf-8") as f:
        for t, (outcome, msg) in earlier["outcomes"].items():
            if outcome != "died":
                f.write(json.dumps({"id": t, "outcome": outcome, "msg": msg}) + "\n")
        for key, (name, runner, reason, test) in earlier.get("programs", {}).items():
            f.write(json.dumps({"prog": key, "program": name, "runner": runner, "reason": reason,
                                "test": test}) + "\n")
    with open(skip, "w", encoding="utf-8") as f:
        f.write("\n".join(earlier["outcomes"]) + "\n")
    return ([dict(d) for d in earlier["deaths"]], earlier["fallback_lines"],
            collections.Counter(earlier.get("fallback_reasons", {})),
            {k: list(v) for k, v in earlier.get("fallback_tests", {}).items()})


def parse_shards(text):
    """`api_test=4,lax_test=3` -> {"api_test": 4, "lax_test": 3} (files not named: one shard)."""
    out = {}
    for item in (text or "").split(","):
        if item.strip():
            name, _, k = item.partition("=")
            out[name.strip().removesuffix(".py")] = max(1, int(k))
    return out


def merge_shards(parts):
    """One file's result from its shards' results (each ran a disjoint share of its tests)."""
    out = {"outcomes": {}, "deaths": [], "fallback_lines": 0, "fallback_reasons": {}, "fallback_tests": {},
           "cut": False, "programs": {}}
    reasons = collections.Counter()
    for r in parts:
        out["outcomes"].update(r["outcomes"])
        out["programs"].update(r.get("programs", {}))
        out["deaths"] += r["deaths"]
        out["fallback_lines"] += r["fallback_lines"]
        reasons.update(r.get("fallback_reasons", {}))
        add_tests(out["fallback_tests"], r.get("fallback_tests", {}))
        out["cut"] = out["cut"] or r["cut"]
    out["fallback_reasons"] = dict(reasons)
    return out


def run_file(tests_dir, name, platform, work, env, deadline, file_timeout, kexpr, progress, earlier=None,
             shard=(0, 1)):
    """Runs one test file on one platform to the end, restarting after each death (continuing
    `earlier`, a result of the same file cut short by an earlier call's budget, when given).
    `shard` (i, k): only the tests at positions i, i + k, ... of the file's collection order."""
    i, k = shard
    tag = "%s.%s" % (name, platform) + (".shard%dof%d" % (i, k) if k > 1 else "")
    log = os.path.join(work, tag + ".jsonl")
    skip = os.path.join(work, tag + ".skip")
    deaths, fallbacks, reasons, named = seed(log, skip, earlier)
    restarts, cut = 0, False
    file_deadline = time.time() + file_timeout
    while True:
        left = min(deadline, file_deadline) - time.time()
        if left <= 5:
            cut = True
            break
        # -s: no capture, so that the plugin's warnings (fallbacks) and a dying process's last
        # words (an abort message, a C++ check) reach this log.
        cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "plugin",
               os.path.join(tests_dir, name + ".py")]
        if kexpr:
            cmd += ["-k", kexpr]
        penv = dict(env, JAXSLICE_LOG=log, JAXSLICE_SKIP=skip, JAXSLICE_SHARD="%d/%d" % shard)
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(cmd, env=penv, stdout=out, stderr=subprocess.STDOUT, cwd=tests_dir,
                                    start_new_session=True)
            hung = False
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
                # Past the file's own limit it hung; past the call's budget it was only cut short.
                hung = time.time() < deadline - 1
                if not hung:
                    cut = True
                    out.seek(0)
                    n, why, tests = fallbacks_in(out.read())
                    fallbacks += n
                    reasons.update(why)
                    add_tests(named, tests)
                    break
            out.seek(0)
            text = out.read()
        n, why, tests = fallbacks_in(text)
        fallbacks += n
        reasons.update(why)
        add_tests(named, tests)
        outcomes, started = read_log(log)
        running = [t for t in started if t not in outcomes]
        normal = not hung and rc in (0, 1, 5)  # all passed / some failed / none collected
        if normal:
            if rc == 5 and not outcomes:
                deaths.append({"id": None, "why": "no tests collected", "words": last_words(text)})
            elif not outcomes and rc != 0:
                deaths.append({"id": None, "why": "collection failed", "words": last_words(text, 12)})
            break
        dead = running[-1] if running else None
        if hung and dead is None:
            cut = True
            break
        deaths.append({"id": dead, "why": died_reason(rc, hung), "words": last_words(text)})
        progress("%s/%s: %s in %s" % (platform, tag, deaths[-1]["why"], dead))
        restarts += 1
        if dead is None or restarts > MAX_RESTARTS:
            break
        with open(skip, "w", encoding="utf-8") as f:
            f.write("\n".join(list(outcomes) + [d["id"] for d in deaths if d["id"]]) + "\n")
    outcomes, _ = read_log(log)
    for d in deaths:
        if d["id"]:
            outcomes[d["id"]] = ("died", d["why"])
    return {"outcomes": outcomes, "deaths": deaths, "fallback_lines": fallbacks,
            "fallback_reasons": dict(reasons), "fallback_tests": named, "cut": cut,
            "programs": read_programs(log)}


def normalize(msg):
    """An error message without its numbers, shapes and addresses, for grouping."""
    msg = re.sub(r"0x[0-9a-fA-F]+", "ADDR", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:160]


def compare(results, files, ref, dut):
    """Per-file rows and the regressions (pass on `ref`, not on `dut`) grouped by message."""
    rows, groups = [], collections.defaultdict(list)
    for name in files:
        r, d = results.get((name, ref)), results.get((name, dut))
        if r is None or d is None:
            continue
        ro, do = r["outcomes"], d["outcomes"]
        count = lambda o, k: sum(1 for v in o.values() if v[0] == k)  # noqa: E731
        passed_ref = {t for t, v in ro.items() if v[0] == "passed"}
        lost = sorted(t for t in passed_ref if do.get(t, ("not run", ""))[0] != "passed")
        for t in lost:
            outcome, msg = do.get(t, ("not run", ""))
            groups[(outcome, normalize(msg))].append(t)
        rows.append({
            "file": name,
            ref: {k: count(ro, k) for k in ("passed", "failed", "skipped", "died")},
            dut: {k: count(do, k) for k in ("passed", "failed", "skipped", "died")},
            "ref_pass_dut_not": len(lost),
            "ref_pass_dut_pass": len(passed_ref) - len(lost),
            "dut_fallback_lines": d["fallback_lines"],
            "cut": r["cut"] or d["cut"],
        })
    return rows, groups


def programs_section(results, dut):
    """Markdown lines: the programs the tests loaded on `dut` (report() after each test), per file:
    how many, how many run as one graph, eager, on the vendor runtime, still in the guard's trial;
    the eager and fallback ones by reason. Empty when no program lines were recorded."""
    per_file, why = [], collections.defaultdict(lambda: [0, collections.Counter(), []])
    total, loaded = collections.Counter(), 0
    for (name, plat), res in sorted(results.items()):
        progs = res.get("programs") or {}
        if plat != dut or not progs:
            continue
        c = collections.Counter()
        for prog, runner, reason, _test in progs.values():
            kind = ("graph" if runner in GRAPH_RUNNERS else "vendor" if runner == "vendor fallback"
                    else "eager" if runner == "eager" else "trial")
            c[kind] += 1
            c["guard"] += kind == "eager" and (reason or "").startswith(GUARD_CHOICE)
            if kind in ("eager", "vendor"):
                w = why[(kind, normalize(reason or "(no reason given)"))]
                w[0] += 1
                w[1][name] += 1
                if prog not in w[2] and len(w[2]) < 3:
                    w[2].append(prog)
        total.update(c)
        n = len(progs)
        loaded += n
        per_file.append("| %s | %d | %d (%.1f%%) | %d | %d | %d | %d |" % (
            name, n, c["graph"], 100.0 * c["graph"] / n, c["eager"], c["guard"], c["vendor"], c["trial"]))
    if not per_file:
        return []
    n = loaded
    out = ["", "## Programs on %s (report() after each test)" % dut, "",
           "| file | programs | one graph | eager | of them the guard's choice | vendor runtime | guard trial |",
           "|---|---|---|---|---|---|---|"]
    out += per_file
    out += ["", "Of %d programs loaded, %d (%.1f%%) run as one graph, %d eager (%d of them because the never-slower "
            "guard measured eager fastest: %.1f%% one graph or the guard's choice), %d on the vendor runtime, %d "
            "still in the guard's trial." % (
                n, total["graph"], 100.0 * total["graph"] / n, total["eager"], total["guard"],
                100.0 * (total["graph"] + total["guard"]) / n, total["vendor"], total["trial"])]
    if why:
        out += ["", "| programs | runs | reason | files | examples |", "|---|---|---|---|---|"]
        for (kind, reason), (k, files_, ex) in sorted(why.items(), key=lambda kv: -kv[1][0]):
            fl = ", ".join("%s %d" % f for f in sorted(files_.items(), key=lambda f: -f[1]))
            out.append("| %d | %s | %s | %s | %s |" % (k, kind, reason.replace("|", "\\|"), fl,
                                                       ", ".join("`%s`" % e for e in ex)))
    return out


def markdown(rows, groups, results, ref, dut, title):
    out = ["# " + title, "",
           "| file | %s pass / fail / skip / died | %s pass / fail / skip / died | pass on %s, not on %s | "
           "of %s's passes | fallback warnings | cut short |" % (ref, dut, ref, dut, ref),
           "|---|---|---|---|---|---|---|"]
    tot = collections.Counter()
    for r in rows:
        a, b = r[ref], r[dut]
        kept = r["ref_pass_dut_pass"] + r["ref_pass_dut_not"]
        pct = "%.1f%%" % (100.0 * r["ref_pass_dut_pass"] / kept) if kept else "-"
        out.append("| %s | %d / %d / %d / %d | %d / %d / %d / %d | %d | %s | %d | %s |" % (
            r["file"], a["passed"], a["failed"], a["skipped"], a["died"], b["passed"], b["failed"],
            b["skipped"], b["died"], r["ref_pass_dut_not"], pct, r["dut_fallback_lines"],
            "yes" if r["cut"] else ""))
        tot.update({"kept": kept, "same": r["ref_pass_dut_pass"], "died_ref": a["died"], "died_dut": b["died"]})
    if tot["kept"]:
        out += ["", "Of %d tests that pass on %s, %d (%.2f%%) pass on %s; deaths: %s %d, %s %d." % (
            tot["kept"], ref, tot["same"], 100.0 * tot["same"] / tot["kept"], dut, ref, tot["died_ref"],
            dut, tot["died_dut"])]
    if groups:
        out += ["", "## Pass on %s, not on %s, by error" % (ref, dut), "",
                "| tests | %s outcome | message | examples |" % dut, "|---|---|---|---|"]
        for (outcome, msg), ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            ex = ", ".join("`%s`" % i.split("::")[-1][:60] for i in ids[:3])
            out.append("| %d | %s | %s | %s |" % (len(ids), outcome, msg.replace("|", "\\|"), ex))
    reasons = collections.defaultdict(collections.Counter)
    named = collections.defaultdict(list)
    for (name, plat), res in sorted(results.items()):
        if plat == dut:
            for why, n in res.get("fallback_reasons", {}).items():
                reasons[why][name] += n
            for why, ids in res.get("fallback_tests", {}).items():
                named[why] += ids
    if reasons:
        out += ["", "## Fallback warnings on %s, by reason" % dut, "",
                "| warnings | reason | files | tests |", "|---|---|---|---|"]
        for why, per_file in sorted(reasons.items(), key=lambda kv: -sum(kv[1].values())):
            files_ = ", ".join("%s %d" % f for f in sorted(per_file.items(), key=lambda f: -f[1]))
            ex = ", ".join("`%s`" % i.split("::")[-1][:60] for i in named.get(why, [])[:3])
            out.append("| %d | %s | %s | %s |" % (sum(per_file.values()), why.replace("|", "\\|"), files_, ex))
    out += programs_section(results, dut)
    deaths = [(k, d) for k, res in sorted(results.items()) for d in res["deaths"]]
    if deaths:
        out += ["", "## Process deaths", ""]
        for (name, plat), d in deaths:
            out.append("- %s %s `%s`: %s" % (plat, name, d["id"], d["why"]))
            out += ["    " + w[:300] for w in d["words"]]
    return "\n".join(out) + "\n"


def load_results(path):
    """The per-(file, platform) results of an earlier jax_tests.json[.gz]."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)["results"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", required=True, help="folder of JAX's tests/*.py")
    ap.add_argument("--files", default=DEFAULT_FILES)
    ap.add_argument("--platforms", default="cuda,vmm", help="reference first, then the platform under test")
    ap.add_argument("--out", default="jax_tests")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--shards", default=DEFAULT_SHARDS,
                    help="FILE=K,...: run FILE as K processes side by side, each a share of its tests "
                         "(the longest files; default %(default)s)")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--file-timeout-s", type=float, default=600)
    ap.add_argument("-k", dest="kexpr", default=None, help="pytest -k for every file")
    ap.add_argument("--vmm-lib", default=os.environ.get("XLA_VMM_LIBRARY"),
                    help="the plugin library (default XLA_VMM_LIBRARY)")
    ap.add_argument("--ref-from", help="an earlier jax_tests.json[.gz] whose reference-platform results are "
                    "reused (the reference is not run again)")
    ap.add_argument("--resume-from", help="an earlier jax_tests.json[.gz] of the same code: files it finished "
                    "are reused on both platforms, files it cut short continue where they stopped")
    args = ap.parse_args()
    files = [f.strip().removesuffix(".py") for f in args.files.split(",") if f.strip()]
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()]
    if len(platforms) != 2:
        ap.error("--platforms: a reference and a platform under test")
    missing = [f for f in files if not os.path.isfile(os.path.join(args.tests, f + ".py"))]
    if missing:
        ap.error("not in %s: %s" % (args.tests, ", ".join(missing)))
    if "vmm" in platforms and not (args.vmm_lib and os.path.isfile(args.vmm_lib)):
        ap.error("--vmm-lib / XLA_VMM_LIBRARY: no plugin library at %r" % args.vmm_lib)
    vmm_lib = os.path.abspath(args.vmm_lib) if args.vmm_lib else None
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "logs")
    os.makedirs(work, exist_ok=True)
    deadline = time.time() + args.budget_s
    lock = threading.Lock()

    def progress(msg):
        with lock:
            print(msg, flush=True)

    results, partial = {}, {}
    if args.ref_from:
        earlier = load_results(args.ref_from)
        for f in files:
            if "%s:%s" % (f, platforms[0]) in earlier:
                results[(f, platforms[0])] = earlier["%s:%s" % (f, platforms[0])]
    if args.resume_from:
        for key, res in load_results(args.resume_from).items():
            f, _, p = key.partition(":")
            if f in files and p in platforms and (f, p) not in results:
                (partial if res["cut"] else results)[(f, p)] = res
    # The longest files first, so that the pool ends together.
    size = lambda f: os.path.getsize(os.path.join(args.tests, f + ".py"))  # noqa: E731
    shards = parse_shards(args.shards)
    jobs = [(f, p, i, shards.get(f, 1)) for f in sorted(files, key=size, reverse=True) for p in platforms
            if (f, p) not in results for i in range(shards.get(f, 1))]

    def earlier_for(f, p, i):
        # A cut file continues in every shard (its tests already run are skipped by each); its
        # deaths and fallback count are carried once, by shard 0.
        e = partial.get((f, p))
        if e is None or i == 0:
            return e
        return {"outcomes": e["outcomes"], "deaths": [], "fallback_lines": 0, "fallback_reasons": {}}

    parts = collections.defaultdict(list)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(run_file, os.path.abspath(args.tests), f, p, work, platform_env(p, os.environ, vmm_lib),
                            deadline, args.file_timeout_s, args.kexpr, progress, earlier_for(f, p, i),
                            (i, k)): (f, p, k)
                for f, p, i, k in jobs}
        for fut in concurrent.futures.as_completed(futs):
            f, p, k = futs[fut]
            parts[(f, p)].append(fut.result())
            if len(parts[(f, p)]) < k:
                continue
            res = results[(f, p)] = merge_shards(parts[(f, p)])
            c = collections.Counter(v[0] for v in res["outcomes"].values())
            progress("done %s on %s: %s%s" % (f, p, dict(c), " (cut short)" if res["cut"] else ""))
    ref, dut = platforms
    rows, groups = compare(results, files, ref, dut)
    title = "JAX tests, %s vs %s" % (ref, dut)
    with open(os.path.join(args.out, "jax_tests.json"), "w") as fh:
        json.dump({"rows": rows, "results": {"%s:%s" % k: v for k, v in results.items()}}, fh, indent=1)
    # The per-test logs as one archive (the device tool brings back few files).
    with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(work, arcname="logs")
    shutil.rmtree(work)
    md = markdown(rows, groups, results, ref, dut, title)
    with open(os.path.join(args.out, "jax_tests.md"), "w") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
