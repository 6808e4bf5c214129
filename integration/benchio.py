"""What the benchmarks here share: each row runs as a child process whose result is its last JSON line on
stdout (so that each row has its own JAX, plugin and device state), and the results end as a Markdown table
(printed, and DIR/NAME.md) and DIR/NAME.json."""
import json
import os
import subprocess

# Untimed steps before a benchmark's timed ones, enough for xla-vmm's never-slower guard to have decided in
# graph mode: its trial takes ~19 steps of a program, its second look ~10 more, 10 steps after the decision.
GUARD_WARMUP_STEPS = 45


def run_json_child(argv, env, timeout, stderr_path=None):
    """Run `argv` with `env`; returns (the last stdout line starting with `{`, parsed; None) or (None, a short
    reason: the timeout, or the exit status and the last three lines of stderr). `stderr_path`: its stderr goes
    to that file (which the child can then measure) instead of a pipe."""
    try:
        if stderr_path is None:
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
            err = p.stderr
        else:
            with open(stderr_path, "w") as fh:
                p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=fh, text=True, timeout=timeout)
            with open(stderr_path, errors="replace") as fh:
                err = fh.read()
    except subprocess.TimeoutExpired:
        return None, "timeout after %ds" % timeout
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, "rc %d: %s" % (p.returncode, " | ".join((err or p.stdout).strip().splitlines()[-3:]))
    return json.loads(lines[-1]), None


def write_results(out, name, md_lines, data):
    """Print the table `md_lines` and write it to OUT/NAME.md, `data` to OUT/NAME.json."""
    text = "\n".join(md_lines)
    print(text)
    with open(os.path.join(out, name + ".md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(out, name + ".json"), "w") as fh:
        json.dump(data, fh, indent=1)


def memory_sums(report, keys):
    """`report()` data's device memory counters `keys`, each summed over its devices (a key some device
    lacks, as an older plugin's, is left out)."""
    mem = [d.get("memory", {}) for d in report.get("devices", [])]
    return {k: sum(m[k] for m in mem) for k in keys if mem and all(k in m for m in mem)}


def staged_of(p):
    """What a program past the device budget moved and measured: its `report()` entry's `staging`, the keys the
    result lines use, with the program's name, runner and steps."""
    s = p["staging"]
    keys = ("staged_bytes", "device_bytes", "bytes_in_per_step", "bytes_out_per_step", "estimated_step_us",
            "unbudgeted_step_us", "must_cross_us", "must_cross_in", "must_cross_out", "timed_steps", "gpu_step_us",
            "copy_in_gbps", "waited_us", "link_utilisation", "link_bytes_per_s", "link_out_bytes_per_s",
            "link_both_bytes_per_s")
    return dict({"program": p["program"], "id": p.get("id"), "runner": p["runner"], "steps": p.get("steps", 0)},
                **{k: s[k] for k in keys if k in s})


def staged_line(st):
    """One line of what a staged program (`staged_of`) moved, measured and planned."""
    mib = lambda b: "%.0f MiB" % (b / 2**20)  # noqa: E731
    # The link's time for this step's bytes at the rate its copies in ran, the directions taking turns (a
    # full-duplex link may need less).
    gbps = st.get("copy_in_gbps") or 0
    bound = (st["bytes_in_per_step"] + st["bytes_out_per_step"]) / (gbps * 1e6) if gbps else None
    text = ("%s (%s, %d steps): past the budget, %s staged, %s on the device; per step %s in, %s out"
            % (st["program"], st["runner"], st["steps"], mib(st.get("staged_bytes", 0)),
               mib(st.get("device_bytes", 0)), mib(st["bytes_in_per_step"]), mib(st["bytes_out_per_step"])))
    if st.get("timed_steps"):
        text += ("; last timed step %.1f ms on the device, copies in at %.1f GB/s, compute waited %.1f ms, "
                 "link %.0f%% busy" % (st["gpu_step_us"] / 1e3, gbps, st["waited_us"] / 1e3,
                                      100 * st.get("link_utilisation", 0)))
        if bound:
            text += "; both ways at that rate %.1f ms" % bound
    text += "; planned %.1f ms (%.1f with no budget)" % (st.get("estimated_step_us", 0) / 1e3,
                                                         st.get("unbudgeted_step_us", 0) / 1e3)
    if st.get("must_cross_us"):
        text += "; any staging moves at least %s in, %s out: %.1f ms of link" % (
            mib(st.get("must_cross_in", 0)), mib(st.get("must_cross_out", 0)), st["must_cross_us"] / 1e3)
    if st.get("link_bytes_per_s"):
        text += " with the link at %.1f GB/s in, %.1f out, %.1f both at once" % (
            st["link_bytes_per_s"] / 1e9, st.get("link_out_bytes_per_s", 0) / 1e9,
            st.get("link_both_bytes_per_s", 0) / 1e9)
    return text


def parse_bytes(text):
    """A byte count as the plugin takes it (`16G`, `512M`, `1.5GiB`, `1048576`: K, M, G, T powers of 1024)."""
    t = text.strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[:-len(suffix)]
            break
    shift = {"K": 10, "M": 20, "G": 30, "T": 40}.get(t[-1:], 0)
    return int(float(t[:-1] if shift else t) * (1 << shift))


def gpu_memory_bytes(gpu=0):
    """The GPU's memory as nvidia-smi reports it (None where it cannot say)."""
    try:
        p = subprocess.run(["nvidia-smi", "-i", str(gpu), "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        return int(float(p.stdout.split()[0]) * 2**20) if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def memory_fraction(limit, total):
    """`limit` (parse_bytes text) as a share of `total` bytes: stock XLA's XLA_PYTHON_CLIENT_MEM_FRACTION for the
    same device memory as XLA_VMM_DEVICE_MEMORY_LIMIT=limit."""
    return parse_bytes(limit) / total


if __name__ == "__main__":
    # python3 integration/benchio.py memory-fraction LIMIT [DEFAULT]: the share of GPU 0's memory (DEFAULT where
    # nvidia-smi cannot say).
    import sys
    if len(sys.argv) in (3, 4) and sys.argv[1] == "memory-fraction":
        total = gpu_memory_bytes()
        print("%.4f" % memory_fraction(sys.argv[2], total) if total else (sys.argv[3:] or ["-"])[0])
    else:
        sys.exit("usage: benchio.py memory-fraction LIMIT [DEFAULT]")
