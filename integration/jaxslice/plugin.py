"""pytest plugin of the JAX test slice (integration/jax_tests.py): one JSON line per test event.

Loaded with `-p plugin` (this folder on PYTHONPATH). JAXSLICE_LOG is the file the lines go to:
`{"start": id}` before a test runs (flushed and synced, so that a test that kills the process is
known), then `{"id": id, "outcome": "passed" | "failed" | "skipped", "msg": first line}` once its
outcome is known; `##jaxslice-start id` on stdout too (see START_MARKER). JAXSLICE_SKIP names a file of test ids (one per line) left out of the run: those a
previous process already ran, or died in. JAXSLICE_SHARD "i/k" keeps the tests at positions i, i + k, ...
of the collection (one of k processes sharing a file). With JAXSLICE_PROGRAMS=1 (the xla-vmm platform),
after each test the plugin's `report()` is read and every program it lists that is new or runs differently
since the last read gets a line `{"prog": "pid:id", "program": name, "runner": how it runs, "reason": why
not as a graph, "test": id}`: what share of the programs the tests load runs as one graph, and why not.
"""
import json
import os

_log = None
_failed = set()


def _write(rec):
    global _log
    if _log is None:
        _log = open(os.environ["JAXSLICE_LOG"], "a", encoding="utf-8")
    _log.write(json.dumps(rec) + "\n")
    _log.flush()
    os.fsync(_log.fileno())


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        text = str(report.longrepr[2])
    else:
        text = str(report.longrepr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:400] if lines else ""


def shard_of(text):
    """JAXSLICE_SHARD "i/k" -> (i, k); unset or malformed: the whole file, (0, 1)."""
    try:
        i, k = (int(v) for v in (text or "0/1").split("/"))
    except ValueError:
        return 0, 1
    return (i, k) if 0 <= i < k else (0, 1)


def pytest_collection_modifyitems(session, config, items):
    # The shard first, over the whole collection (the same share after every restart), then the
    # tests an earlier process of this shard already ran.
    i, k = shard_of(os.environ.get("JAXSLICE_SHARD"))
    skip = set()
    path = os.environ.get("JAXSLICE_SKIP")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            skip = {ln.strip() for ln in f if ln.strip()}
    keep = [it for n, it in enumerate(items) if n % k == i and it.nodeid not in skip]
    kept = {id(it) for it in keep}
    gone = [it for it in items if id(it) not in kept]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


# Printed before each test (pytest runs with -s): the runner attributes the plugin's warnings that
# follow it, vendor fallbacks, to that test.
START_MARKER = "##jaxslice-start "


def pytest_runtest_logstart(nodeid, location):
    _write({"start": nodeid})
    print("\n" + START_MARKER + nodeid, flush=True)


_programs = {}


def guard_choice(p):
    """Why a program that could be a graph runs eager: the never-slower guard measured it fastest so
    (`guard:` and its figures, ms), or None."""
    g = p.get("guard")
    if p.get("runner") != "eager" or not g:
        return None
    ms = lambda k: "-" if g.get(k) is None else "%.3f" % (g[k] / 1e3)  # noqa: E731
    return "guard: eager measured fastest (va-stable %s, recapture %s, eager %s ms)" % (
        ms("va_stable_us"), ms("recapture_us"), ms("eager_us"))


def pytest_runtest_logfinish(nodeid, location):
    if os.environ.get("JAXSLICE_PROGRAMS") != "1":
        return
    try:
        from jax_plugins import xla_vmm
        programs = xla_vmm.report().get("programs", [])
    except Exception as e:  # noqa: BLE001 - a report that cannot be read is said once, not fatal
        programs = []
        if "error" not in _programs:
            _programs["error"] = True
            _write({"prog_error": str(e)[:300]})
    for p in programs:
        key = "%d:%s" % (os.getpid(), p.get("id"))
        line = (p.get("program"), p.get("runner"), p.get("reason") or guard_choice(p))
        if _programs.get(key) != line:
            _programs[key] = line
            _write({"prog": key, "program": line[0], "runner": line[1], "reason": line[2], "test": nodeid})


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if report.when == "setup" and report.outcome != "passed":
        _failed.add(nodeid)
        _write({"id": nodeid, "outcome": report.outcome, "msg": _message(report)})
    elif report.when == "call" and nodeid not in _failed:
        outcome = "skipped" if hasattr(report, "wasxfail") else report.outcome
        if outcome != "passed":
            _failed.add(nodeid)
        _write({"id": nodeid, "outcome": outcome, "msg": _message(report) if outcome != "passed" else ""})
    elif report.when == "teardown" and report.outcome == "failed" and nodeid not in _failed:
        _write({"id": nodeid, "outcome": "failed", "msg": "teardown: " + _message(report)})
