"""The installed wheel under a real jax on a machine without a GPU (CI: .ci/test runs it in a venv
with jax + jaxlib CPU and the wheel installed; `python -m unittest discover -s integration/tests -p
'nogpu_*.py'`). Named `nogpu_*`, not `test_*`: pytest's GPU suite in this folder leaves it alone.

Installing the package must not change what JAX does when vmm is not asked for, and asking for vmm
must end in an error that says what is missing and what to set or install:

- JAX_PLATFORMS unset: `jnp.ones(3)` works, every device is a CPU, nothing is printed about
  xla-vmm (no driver: it is not registered; its reason is logged at INFO).
- JAX_PLATFORMS=vmm: a RuntimeError naming what is missing (another jax: both versions and the
  pip command; no driver: libcuda.so.1 and XLA_VMM_BACKEND=host).

CI's Debian 12 has Python 3.11, and the newest jax pip offers there (0.10.x) is not the one the
plugin is built for (JAX_VERSION, 0.11.2, which needs Python 3.12). The version refusal is tested
as is; the rest runs with the package's JAX_VERSION set to the installed jax before jax is imported
(`VERSION_OVERRIDE`: a test-only patch of the module, no environment variable), so that the plugin
registers and its driver-missing path and its host backend run under this jaxlib.
"""
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import unittest

# Run first in the child (before jax is imported): the package accepts the installed jax.
VERSION_OVERRIDE = ("import importlib.metadata, jax_plugins.xla_vmm as m; "
                    "m.JAX_VERSION = importlib.metadata.version('jax')\n")


def jax_run(code, override=False, **env):
    """Run `code` in a fresh python of this interpreter with `env` on top of an environment cleaned
    of JAX_PLATFORMS and XLA_VMM_*; returns the CompletedProcess (text)."""
    clean = {k: v for k, v in os.environ.items()
             if k != "JAX_PLATFORMS" and not k.startswith("XLA_VMM_")}
    clean.update(env)
    with tempfile.TemporaryDirectory() as cwd:  # not a checkout: the installed package is imported
        return subprocess.run([sys.executable, "-c", (VERSION_OVERRIDE if override else "") + code],
                              env=clean, cwd=cwd, capture_output=True, text=True, timeout=300)


def last_error(p):
    """The exception line that ended the child (`Type: message`)."""
    lines = [l for l in p.stderr.splitlines() if l and not l.startswith((" ", "-", "For simplicity"))]
    return lines[-1] if lines else ""


CPU_ONES = ("import jax, jax.numpy as jnp\n"
            "x = jnp.ones(3)\n"
            "assert x.tolist() == [1.0, 1.0, 1.0], x\n"
            "print('platforms', sorted({d.platform for d in jax.devices()}))\n"
            "from jax._src import xla_bridge\n"
            "print('vmm registered', 'vmm' in xla_bridge._backend_factories)\n")


class NoGpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import jax_plugins.xla_vmm as pkg

        cls.pkg = pkg
        cls.supported = pkg.JAX_VERSION
        cls.installed = importlib.metadata.version("jax")
        cls.mismatch = pkg._release(cls.installed) != pkg._release(cls.supported)
        probe = jax_run("import jax_plugins.xla_vmm as m; print(m.backend_problem('cuda') or '')")
        cls.driver_missing = "libcuda.so.1 is not found" in probe.stdout

    def setUp(self):
        if not self.driver_missing:
            self.skipTest("this machine has the NVIDIA driver: the no-GPU paths are not reachable")

    def test_the_installed_wheel_is_what_runs(self):
        p = jax_run("import jax_plugins.xla_vmm as m; print(m.__file__); print(m.library_path())")
        self.assertEqual(p.returncode, 0, p.stderr)
        module, library = p.stdout.split()
        self.assertIn("site-packages", module)
        self.assertTrue(library.endswith("xla_vmm_plugin.so"), library)

    def test_unset_jax_platforms_runs_on_cpu_and_says_nothing(self):
        for override in (False, True):
            p = jax_run(CPU_ONES, override)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("platforms ['cpu']", p.stdout)
            self.assertIn("vmm registered False", p.stdout)
            self.assertNotIn("xla-vmm", p.stderr, "a machine without a GPU hears nothing of xla-vmm")
        # Why, at INFO.
        p = jax_run("import logging; logging.basicConfig(level=logging.INFO)\n" + CPU_ONES, True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("the 'vmm' backend is not registered: the NVIDIA driver library libcuda.so.1 is "
                      "not found", p.stderr)

    def test_jax_platforms_vmm_without_a_driver_names_it_and_the_variable_to_set(self):
        p = jax_run("import jax.numpy as jnp; jnp.ones(3)", True, JAX_PLATFORMS="vmm")
        self.assertNotEqual(p.returncode, 0)
        error = last_error(p)
        self.assertTrue(error.startswith("RuntimeError: Unable to initialize backend 'vmm'"), p.stderr)
        self.assertIn("the NVIDIA driver library libcuda.so.1 is not found", error)
        self.assertIn("set XLA_VMM_BACKEND=host", error)

    def test_another_jax_is_refused_with_both_versions_and_the_fix(self):
        if not self.mismatch:
            self.skipTest(f"the installed jax {self.installed} is the supported one")
        fix = f'pip install "jax[cuda13]=={self.supported}"'
        for env in ({}, {"XLA_VMM_BACKEND": "host"}):
            # Named: the error of the first jax call.
            p = jax_run("import jax.numpy as jnp; jnp.ones(3)", JAX_PLATFORMS="vmm", **env)
            self.assertNotEqual(p.returncode, 0)
            error = last_error(p)
            self.assertTrue(error.startswith("RuntimeError: Unable to initialize backend 'vmm'"),
                            p.stderr)
            for text in (f"built for jax {self.supported}", f"jax {self.installed}", fix):
                self.assertIn(text, error)
        # Not named, with a backend that could start (host): one warning, JAX runs on the CPU.
        p = jax_run(CPU_ONES, XLA_VMM_BACKEND="host")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("vmm registered False", p.stdout)
        said = [l for l in p.stderr.splitlines() if "xla-vmm" in l]
        self.assertEqual(len(said), 1, p.stderr)
        self.assertIn(fix, said[0])

    def test_the_host_backend_under_this_jaxlib(self):
        """What the plugin does on this jaxlib when let through: the host client starts (one device,
        buffers round-trip); compiling needs the vendor GPU plugin, which a CPU jax lacks: an error
        that names it and the fix."""
        code = ("import jax, numpy as np\n"
                "print('platform', jax.devices()[0].platform, len(jax.devices()))\n"
                "x = jax.device_put(np.arange(4, dtype=np.float32))\n"
                "print('round trip', np.asarray(x).tolist())\n"
                "import jax_plugins.xla_vmm as vmm\n"
                "r = vmm.report()\n"
                "print('report', r['programs'], [d['device'].split()[0] for d in r['devices']])\n"
                "print(r)\n"
                "a = r['devices'][0]['allocator']\n"
                "print('allocator', a['buffers_live'], a['granules'])\n"
                "del x\n"
                "print('trimmed', vmm.trim(), vmm.report()['devices'][0]['allocator']['granules'])\n"
                "import jax.numpy as jnp\n"
                "jnp.ones(3) + 1\n")
        p = jax_run(code, True, JAX_PLATFORMS="vmm", XLA_VMM_BACKEND="host")
        self.assertIn("platform gpu 1", p.stdout, p.stderr)  # vmm answers as JAX's GPU (the alias)
        self.assertIn("round trip [0.0, 1.0, 2.0, 3.0]", p.stdout, p.stderr)
        # The report: no program yet, the host device's memory (16 B live).
        self.assertIn("report [] ['host']", p.stdout, p.stderr)
        self.assertIn("device host 0", p.stdout, p.stderr)
        # Its allocator: the one buffer, in a small buffers' granule; once it is deleted, trim() releases
        # the granule (2 MiB on the host backend).
        self.assertIn("allocator 1 1", p.stdout, p.stderr)
        self.assertIn("trimmed %d 0" % (2 << 20), p.stdout, p.stderr)
        self.assertNotEqual(p.returncode, 0)
        error = last_error(p)
        self.assertIn("no vendor XLA GPU plugin found", error)
        self.assertIn('pip install "jax[cuda13]"', error)

    def test_xla_vmm_report_writes_the_report_at_exit(self):
        import json
        code = ("import jax, numpy as np\n"
                "x = jax.device_put(np.arange(4, dtype=np.float32))\n"
                "print(np.asarray(x).tolist())\n")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report_%p.json")
            p = jax_run(code, True, JAX_PLATFORMS="vmm", XLA_VMM_BACKEND="host", XLA_VMM_REPORT=path)
            self.assertEqual(p.returncode, 0, p.stderr)
            [name] = os.listdir(d)
            with open(os.path.join(d, name)) as fh:
                r = json.load(fh)
            self.assertEqual(r["programs"], [])
            self.assertEqual([x["device"].split()[0] for x in r["devices"]], ["host"])
            p = jax_run(code, True, JAX_PLATFORMS="vmm", XLA_VMM_BACKEND="host", XLA_VMM_REPORT="-")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("device host", p.stderr)

    def test_a_jax_profiler_trace_holds_the_plugins_plane_and_transfers(self):
        """jax.profiler.trace finds the plugin's profiler extension (JAX registers it when it loads
        the plugin) and the trace it writes holds our plane with the transfers made during it."""
        code = ("import glob, os, tempfile, jax, numpy as np\n"
                "d = tempfile.mkdtemp()\n"
                "with jax.profiler.trace(d):\n"
                "    x = jax.device_put(np.arange(4, dtype=np.float32))\n"
                "    np.asarray(x)\n"
                "files = glob.glob(os.path.join(d, '**', '*.xplane.pb'), recursive=True)\n"
                "data = b''.join(open(f, 'rb').read() for f in files)\n"
                "print('xplane files', len(files))\n"
                "print('plane', b'/device:CUSTOM:xla-vmm' in data)\n"
                "print('transfer', b'transfer to device' in data)\n")
        p = jax_run(code, True, JAX_PLATFORMS="vmm", XLA_VMM_BACKEND="host")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("xplane files 1", p.stdout, p.stderr)
        self.assertIn("plane True", p.stdout, p.stderr)
        self.assertIn("transfer True", p.stdout, p.stderr)

    def test_the_timeline_picture_of_a_trace_shows_our_plane(self):
        """integration/diag/trace_timeline.py draws our plane's events of a trace (here a transfer, on the
        host backend) as an SVG and sums each line's busy time."""
        tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "diag", "trace_timeline.py")
        with tempfile.TemporaryDirectory() as d:
            code = ("import jax, numpy as np\n"
                    "with jax.profiler.trace(%r):\n"
                    "    for _ in range(2):\n"
                    "        np.asarray(jax.device_put(np.arange(1024, dtype=np.float32)))\n" % d)
            p = jax_run(code, True, JAX_PLATFORMS="vmm", XLA_VMM_BACKEND="host")
            self.assertEqual(p.returncode, 0, p.stderr)
            out = os.path.join(d, "t.svg")
            p = subprocess.run([sys.executable, tool, d, "--out", out, "--around", "transfer to device",
                                "--index", "0"], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertRegex(p.stdout, r"xla-vmm .* [1-9]\d* events  busy")
            with open(out) as fh:
                picture = fh.read()
            self.assertTrue(picture.startswith("<svg"))
            self.assertIn("<title>transfer to device", picture)
            p = subprocess.run([sys.executable, tool, d, "--around", "step"], capture_output=True, text=True,
                               timeout=120)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("no 'step' event", p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()
