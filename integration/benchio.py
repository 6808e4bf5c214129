"""What the benchmarks here share: each row runs as a child process whose result is its last JSON line on
stdout (so that each row has its own JAX, plugin and device state), and the results end as a Markdown table
(printed, and DIR/NAME.md) and DIR/NAME.json."""
import json
import os
import subprocess


def run_json_child(argv, env, timeout):
    """Run `argv` with `env`; returns (the last stdout line starting with `{`, parsed; None) or (None, a short
    reason: the timeout, or the exit status and the last three lines of stderr)."""
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout after %ds" % timeout
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, "rc %d: %s" % (p.returncode, " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:]))
    return json.loads(lines[-1]), None


def write_results(out, name, md_lines, data):
    """Print the table `md_lines` and write it to OUT/NAME.md, `data` to OUT/NAME.json."""
    text = "\n".join(md_lines)
    print(text)
    with open(os.path.join(out, name + ".md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(out, name + ".json"), "w") as fh:
        json.dump(data, fh, indent=1)
