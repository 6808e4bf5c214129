"""fsdp.py's training with one process per GPU (`jax.distributed`), the mesh over the 2 global devices.

    python3 dist.py --launch --platform vmm|cuda --steps 20 --config llama_small_f32 [--threshold N]

`--launch` starts both processes (process i sees GPU i: CUDA_VISIBLE_DEVICES=i), waits for them,
prints their output prefixed `[pI]`, checks that both saw the same losses, and prints as its last line
the JSON summary of process 0 (with `per_process` median step times). Exit status 3: every step ran and
the summary is printed, but a process did not exit within --exit-grace seconds after its last step
(`exit_hang` in the summary says which). Without `--launch` this is one
of the processes: `--process-id I [--port P]`.
"""
import json
import os
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fsdp  # noqa: E402

NUM_PROCESSES = 2


def extra(ap):
    ap.add_argument("--launch", action="store_true", help="start both processes and collect their output")
    ap.add_argument("--process-id", type=int, default=None)
    ap.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--timeout", type=int, default=1800, help="--launch: seconds before the processes are killed")
    ap.add_argument("--exit-grace", type=int, default=20,
                    help="--launch: seconds a process may take to exit after every process printed its summary")


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_argv(args, i, port):
    argv = [sys.executable, os.path.abspath(__file__), "--platform", args.platform, "--steps", str(args.steps),
            "--config", args.config, "--exec-mode", args.exec_mode, "--process-id", str(i), "--port", str(port)]
    if args.threshold is not None:
        argv += ["--threshold", str(args.threshold)]
    return argv


def launch(args):
    port = args.port or free_port()
    procs, outputs = [], [[] for _ in range(NUM_PROCESSES)]
    for i in range(NUM_PROCESSES):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i))
        procs.append(subprocess.Popen(child_argv(args, i, port), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))

    def pump(i):
        for line in procs[i].stdout:
            outputs[i].append(line.rstrip("\n"))
            print("[p%d] %s" % (i, line.rstrip("\n")), flush=True)

    pumps = [threading.Thread(target=pump, args=(i,), daemon=True) for i in range(NUM_PROCESSES)]
    for t in pumps:
        t.start()
    # Wait for both; once every process has printed its summary, give them --exit-grace seconds to exit:
    # a process that finished its steps but does not exit is an "exit hang", reported on its own.
    import time
    failed, hung = [], []
    deadline = time.monotonic() + args.timeout
    done_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if done_at is None and all(any(ln.startswith("{") for ln in out) for out in outputs):
            done_at = now
        crashed = done_at is None and any(p.poll() not in (None, 0) for p in procs)
        if crashed:
            # One process died before the end: its peer would wait in a collective until the deadline.
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        if now > deadline or (done_at is not None and now - done_at > args.exit_grace):
            for i, p in enumerate(procs):
                if p.poll() is None:
                    (hung if done_at is not None else failed).append(
                        "process %d: %s" % (i, "no exit %ds after its last step" % args.exit_grace
                                            if done_at is not None else "timeout after %ds" % args.timeout))
                    p.kill()
            break
        time.sleep(0.2)
    for i, p in enumerate(procs):
        rc = p.wait()
        if rc != 0 and not any(h.startswith("process %d:" % i) for h in hung + failed):
            failed.append("process %d: rc %s" % (i, rc))
    for t in pumps:
        t.join(timeout=10)
    summaries = []
    for i, lines in enumerate(outputs):
        js = [ln for ln in lines if ln.startswith("{")]
        if not js:
            failed.append("process %d printed no summary" % i)
            continue
        summaries.append(json.loads(js[-1]))
    if failed:
        sys.exit("dist.py: " + "; ".join(failed))
    first = summaries[0]
    for s in summaries[1:]:
        if s["loss_bits"] != first["loss_bits"]:
            sys.exit("dist.py: the processes disagree on the losses: %s vs %s" % (first["loss_bits"], s["loss_bits"]))
    first["per_process_median_ms"] = [s["median_ms"] for s in summaries]
    first["median_ms"] = max(s["median_ms"] for s in summaries)
    first["exit_hang"] = hung
    print(json.dumps(first), flush=True)
    if hung:
        # The steps ran and the losses are in the summary above, but a process did not exit.
        print("dist.py: exit hang: " + "; ".join(hung), file=sys.stderr, flush=True)
        sys.exit(3)
    return first


def main():
    args = fsdp.parse_args(extra=extra)
    if args.launch:
        launch(args)
        return
    if args.process_id is None or args.port is None:
        sys.exit("dist.py: a process needs --process-id and --port (or use --launch)")
    fsdp.setup_env(args)
    fsdp.register_plugin(args)
    import jax

    jax.distributed.initialize(coordinator_address="127.0.0.1:%d" % args.port, num_processes=NUM_PROCESSES,
                               process_id=args.process_id)
    fsdp.run(args, distributed=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
