"""Binding stats of xla-vmm's VA-stable graph mode, read from the loaded plugin.

``stats()`` returns ``{executable: {...}}`` with, per executable: ``steps``,
``skips``, ``remaps``, ``copies``, ``bytes_copied``, ``unmap_errors``,
``fallbacks``, ``host_binding_ns`` (sum), ``vmm_calls``, ``copy_ops``,
``captures``, ``threshold``, ``threshold_bytes``, ``slots``, ``copy_slots``,
``shadow_bytes``. Counts are per slot per step (summed over steps).
"""
import ctypes
import json


def _plugin(library):
    """The plugin library: `library`, or the one jax loaded (dlopen of the same path returns that
    library, with its statics)."""
    if library is None:
        from . import library_path

        library = library_path()
    if not library:
        raise RuntimeError("xla-vmm: no plugin library (set XLA_VMM_LIBRARY)")
    return ctypes.CDLL(library)


def _json_from(library, symbol):
    """The JSON a `char *symbol(void)` of the plugin library returns (freed after)."""
    lib = _plugin(library)
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_void_p
    fn.argtypes = []
    lib.xla_vmm_stats_free.restype = None
    lib.xla_vmm_stats_free.argtypes = [ctypes.c_void_p]
    p = fn()
    try:
        text = ctypes.string_at(p).decode()
    finally:
        lib.xla_vmm_stats_free(p)
    return json.loads(text)


class Report(dict):
    """``report()``'s data (``programs``, ``dropped``: the last programs dropped, ``dropped_total``,
    ``devices``); ``str()`` of it is a table."""

    def __str__(self):
        rows = [("program", "mode", "runs as", "steps", "why not the fast path / guard")]
        dropped = self.get("dropped", [])
        lines_of = [(p, "") for p in self.get("programs", [])] + [(p, " (dropped)") for p in dropped]
        for p, mark in lines_of:
            why = p.get("reason") or ""
            g = p.get("guard")
            if g:
                ms = lambda k: "-" if g.get(k) is None else "%.3f" % (g[k] / 1e3)  # noqa: E731
                if g.get("va_stable_skipped"):
                    why = "guard at step %d: recapture %s ms (replayed one graph: va-stable and eager not tried)" % (
                        g["decided_at_step"], ms("recapture_us"))
                else:
                    why = "guard at step %d: va-stable %s, recapture %s" % (
                        g["decided_at_step"], ms("va_stable_us"), ms("recapture_us"))
                    why += (" ms (eager not sampled: recapture replayed one graph)" if g.get("eager_skipped")
                            else ", eager %s ms" % ms("eager_us"))
                s = g.get("second_look")
                if s:
                    sm = lambda k: "-" if s.get(k) is None else "%.3f" % (s[k] / 1e3)  # noqa: E731
                    # The runner that kept the program (eager's median since the plugin reports it), then
                    # graph-recapture.
                    kept = "eager" if s.get("va_stable_us") is None and s.get("eager_us") is not None else "va-stable"
                    why += "; second look at step %d: %s %s, recapture %s ms" % (
                        s["decided_at_step"], kept, sm(kept.replace("-", "_") + "_us"), sm("recapture_us"))
                if g.get("recapture_gave_way_at_step") is not None:
                    why += "; recapture kept capturing: va-stable from step %d" % g["recapture_gave_way_at_step"]
            caps = p.get("graph_captures", 0)
            if p["runner"] == "graph-recapture" and caps > 2:
                # Its parameters' addresses change from step to step: a capture's host time each time.
                why = ("captured %d times in %d steps; " % (caps, p["steps"]) + why).rstrip("; ")
            rows.append((p["program"] + mark, p["mode"], p["runner"], str(p["steps"]), why[:200]))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
        if self.get("dropped_total", 0) > len(dropped):
            lines.append("(%d programs dropped in all; the last %d are listed)" % (self["dropped_total"], len(dropped)))
        for p in self.get("programs", []):
            s = p.get("staging")
            if p.get("staging_note"):
                lines.append("%s: part in host memory, not staged (%s): its kernels read it in place"
                             % (p["program"], p["staging_note"]))
            if s:
                lines.append("%s: part in host memory; %d buffers (%.1f MiB) staged through a %.1f MiB device "
                             "area (%d, %.1f MiB, kept there from step to step; %d, %.1f MiB, fetched by the step "
                             "before), %d (%.1f MiB) read in place; per step %.1f MiB in, %.1f MiB out"
                             % (p["program"], s["staged"], s["staged_bytes"] / 2**20, s["area_bytes"] / 2**20,
                                s.get("kept", 0), s.get("kept_bytes", 0) / 2**20, s.get("carried", 0),
                                s.get("carried_bytes", 0) / 2**20, s["in_place"], s["in_place_bytes"] / 2**20,
                                s["bytes_in_per_step"] / 2**20,
                                s["bytes_out_per_step"] / 2**20))
                if s.get("timed_steps"):
                    lines.append("%s: last step timed: %.2f ms on the device, copies in %.2f ms at %.1f GB/s, "
                                 "compute waited %.2f ms, link %.0f%% busy"
                                 % (p["program"], s["gpu_step_us"] / 1e3, s["copy_in_us"] / 1e3, s["copy_in_gbps"],
                                    s["waited_us"] / 1e3, 100 * s["link_utilisation"]))
        if any(d["memory"]["limits"].get("device") is not None for d in self.get("devices", [])):
            # Under a device budget, what each program holds of its own.
            for p in self.get("programs", []):
                o = p.get("memory")
                if o and o["device_bytes"] + o["host_bytes"] + o["shared_bytes"] > 0:
                    lines.append("%s: its own memory %.1f MiB on the device, %.1f MiB in host memory; it maps "
                                 "%.1f MiB of temporaries shared with other programs"
                                 % (p["program"], o["device_bytes"] / 2**20, o["host_bytes"] / 2**20,
                                    o["shared_bytes"] / 2**20))
        for d in self.get("devices", []):
            m = d["memory"]
            lim = m["limits"].get("device")
            moved = (", %d moved for their programs' plans" % m["relocated"]) if m.get("relocated") else ""
            lines.append("device %s: %.2f GiB on the device%s, %.2f GiB in host memory (%d allocations past "
                         "the device budget%s)" % (d["device"], m["device_bytes"] / 2**30,
                                                   "" if lim is None else " (limit %.2f GiB)" % (lim / 2**30),
                                                   m["host_bytes"] / 2**30, m["spilled"], moved))
            if "va_ranges" in m:
                lines.append("device %s: %d physical allocations, %d address ranges (%.2f GiB) reserved"
                             % (d["device"], m["allocations"], m["va_ranges"], m["va_bytes"] / 2**30))
            t = d.get("shared_temporaries")
            if t and t["memories"]:
                lines.append("device %s: %d memories (%.1f MiB) of temporaries shared by loaded programs"
                             % (d["device"], t["memories"], t["bytes"] / 2**20))
            if "library_plans" in d:
                lp = d["library_plans"]
                lines.append("device %s: %d GEMM, %d convolution and %d FFT plans held by loaded programs"
                             % (d["device"], lp["gemm"], lp["conv"], lp.get("fft", 0)))
        return "\n".join(lines)


def report(library=None):
    """Every loaded program of this process with its mode, how it runs now (``va-stable graph``,
    ``graph-recapture``, ``eager``, ``guard trial``, ``vendor fallback``) and why when that is not the
    VA-stable graph, its steps and the never-slower guard's decision (``dropped``: the final lines of the
    last 64 programs dropped; ``dropped_total``: how many were); and each device's memory budget
    use (device and host bytes); for a program whose memory is partly in host memory, what is staged
    through device memory per step (``staging``). Returns a dict; ``print(report())`` shows a table."""
    return Report(_json_from(library, "xla_vmm_report_json"))


def stats(library=None):
    """Per-executable binding stats of this process (``{}`` before any VA-stable run)."""
    return _json_from(library, "xla_vmm_stats_json")


def trim(library=None):
    """Release the device memory xla-vmm's buffer allocators keep cached for reuse (freed buffers'
    blocks, small-buffer granules with nothing live), as ``jax.clear_caches()`` does for compiled
    programs; live arrays and programs are untouched. Returns the bytes released."""
    lib = _plugin(library)
    lib.xla_vmm_trim.restype = ctypes.c_int64
    lib.xla_vmm_trim.argtypes = []
    released = lib.xla_vmm_trim()
    if released < 0:
        raise RuntimeError("xla-vmm: releasing a device's cached memory failed (see the log)")
    return released
