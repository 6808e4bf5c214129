"""The JAX-facing logic that needs no GPU and no jax: the `jax_plugins.xla_vmm` package's
registration (the "cuda" alias under JAX_PLATFORMS=vmm) against a stand-in of JAX's
xla_bridge tables, and the JAX test-slice runner's bookkeeping (logs, deaths, comparison).

    python3 -m unittest discover -s integration/unit -v
"""
import dataclasses
import importlib
import json
import logging
import os
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = os.path.dirname(HERE)


@dataclasses.dataclass(slots=True)
class BackendRegistration:
    """The shape of jax._src.xla_bridge.BackendRegistration."""
    factory: object
    priority: int
    fail_quietly: bool = False
    experimental: bool = False
    c_api: object = None


def supported_jax():
    """The package's JAX_VERSION (read without jax)."""
    return fresh_package().JAX_VERSION


def fake_jax(platforms, version=None, jaxlib_version=None, create_options=""):
    """Stand-ins of the jax modules the package touches (and of jaxlib's version), in sys.modules.
    `version` / `jaxlib_version`: the installed jax's and jaxlib's (default: the supported one)."""
    supported = supported_jax()
    xb = types.ModuleType("jax._src.xla_bridge")
    xb._backend_factories = {}
    xb._backends = {}
    xb._alias_to_platforms = {"gpu": ["cuda", "rocm", "oneapi"]}
    xb.BackendRegistration = BackendRegistration

    def register_plugin(name, priority=400, library_path=None, options=None, **_):
        xb._backend_factories[name] = BackendRegistration(
            lambda: ("client", name, options() if callable(options) else options), priority,
            c_api="c_api:" + name)
    xb.register_plugin = register_plugin

    def register_backend_factory(name, factory, *, priority=0, fail_quietly=True, experimental=False,
                                 **_):
        xb._backend_factories[name] = BackendRegistration(factory, priority, fail_quietly, experimental)
    xb.register_backend_factory = register_backend_factory
    cfg = types.ModuleType("jax._src.config")
    cfg.jax_platforms = types.SimpleNamespace(value=platforms)
    cfg.jax_pjrt_client_create_options = types.SimpleNamespace(value=create_options)
    src = types.ModuleType("jax._src")
    src.xla_bridge, src.config = xb, cfg
    jax = types.ModuleType("jax")
    jax._src = src
    jax_version = types.ModuleType("jax.version")
    jax_version.__version__ = version or supported
    jaxlib = types.ModuleType("jaxlib")
    jaxlib_ver = types.ModuleType("jaxlib.version")
    jaxlib_ver.__version__ = jaxlib_version or supported
    sys.modules.update({"jax": jax, "jax._src": src, "jax._src.xla_bridge": xb,
                        "jax._src.config": cfg, "jax.version": jax_version, "jaxlib": jaxlib,
                        "jaxlib.version": jaxlib_ver})
    return xb


def forget_jax():
    for m in [m for m in sys.modules
              if m in ("jax", "jaxlib") or m.startswith(("jax.", "jaxlib.", "jax_plugins"))]:
        del sys.modules[m]


def fake_driver(pkg, loadable=(), device=True):
    """The package sees exactly the libraries in `loadable` (its calls to the loader are recorded in
    the returned list) and an NVIDIA device node when `device`."""
    tried = []

    def loads(names):
        tried.extend(names)
        return next((n for n in names if n in loadable), None)
    pkg._loads = loads
    # A path that exists (this file) stands for /dev/nvidia0.
    pkg.NVIDIA_DEVICES = (os.path.abspath(__file__) if device else "/nonexistent/nvidia0",)
    return tried


def fresh_package():
    sys.path.insert(0, INTEGRATION)
    for m in [m for m in sys.modules if m.startswith("jax_plugins")]:
        del sys.modules[m]
    return importlib.import_module("jax_plugins.xla_vmm")


class CudaAlias(unittest.TestCase):
    def setUp(self):
        self.lib = tempfile.NamedTemporaryFile(suffix=".so")
        self.env = dict(os.environ)
        os.environ["XLA_VMM_LIBRARY"] = self.lib.name
        os.environ["XLA_VMM_BACKEND"] = "host"  # no vendor lookup in _client_options

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env)
        forget_jax()

    def backends(self, xb, order):
        """JAX's backends() loop, reduced: init each platform's factory in order."""
        for p in order:
            xb._backends[p] = xb._backend_factories[p].factory()

    def test_jax_platforms_vmm_makes_the_vmm_client_jax_cuda_backend(self):
        xb = fake_jax("vmm,cpu")
        # The stock CUDA plugin registered too (discovery order is arbitrary).
        xb.register_plugin("cuda", priority=500, library_path="stock.so")
        pkg = fresh_package()
        pkg.initialize()
        self.assertEqual(xb._alias_to_platforms["vmm"], ["vmm", "cuda"])
        self.backends(xb, ["vmm", "cuda"])
        self.assertIs(xb._backends["cuda"], xb._backends["vmm"], "one client, two names")
        self.assertEqual(xb._backend_factories["cuda"].c_api, "c_api:cuda", "the vendor's C API kept")
        self.assertFalse(xb._backend_factories["cuda"].experimental)

    def test_the_vendor_registering_after_us_is_overridden_at_client_creation(self):
        xb = fake_jax("vmm")
        pkg = fresh_package()
        pkg.initialize()
        xb.register_plugin("cuda", priority=500, library_path="stock.so")  # after ours
        self.backends(xb, ["vmm", "cuda"])
        self.assertIs(xb._backends["cuda"], xb._backends["vmm"])

    def test_without_vmm_in_jax_platforms_nothing_is_aliased(self):
        for platforms in ("", "cuda", "vmm,cuda", "gpu,vmm"):
            xb = fake_jax(platforms)
            xb.register_plugin("cuda", priority=500, library_path="stock.so")
            pkg = fresh_package()
            pkg.initialize()
            self.assertNotIn("vmm", xb._alias_to_platforms, platforms)
            self.backends(xb, ["vmm", "cuda"])
            self.assertIsNot(xb._backends["cuda"], xb._backends["vmm"], platforms)

    def test_on_rocm_vmm_is_jax_rocm_backend_and_the_client_uses_the_hip_backend(self):
        del os.environ["XLA_VMM_BACKEND"]
        vendor = tempfile.TemporaryDirectory()
        pkg_dir = os.path.join(vendor.name, "jax_plugins", "xla_rocm7")
        os.makedirs(pkg_dir)
        open(os.path.join(pkg_dir, "__init__.py"), "w").close()
        open(os.path.join(pkg_dir, "xla_rocm_plugin.so"), "w").close()
        sys.path.insert(0, vendor.name)
        try:
            xb = fake_jax("vmm")
            xb.register_plugin("rocm", priority=500, library_path="stock.so")
            pkg = fresh_package()
            tried = fake_driver(pkg, loadable={"libamdhip64.so.6"})
            if pkg.vendor_plugin()[1] != "rocm":
                self.skipTest("a CUDA vendor plugin is installed here (it is preferred)")
            pkg.initialize()
            self.assertEqual(xb._alias_to_platforms["vmm"], ["vmm", "rocm"])
            self.backends(xb, ["vmm", "rocm"])
            self.assertIs(xb._backends["rocm"], xb._backends["vmm"])
            options = xb._backends["vmm"][2]
            self.assertEqual(options["backend"], "hip")
            self.assertTrue(options["vendor_plugin_path"].endswith("xla_rocm7/xla_rocm_plugin.so"))
            self.assertIn("libamdhip64.so.6", tried, "the HIP runtime is what the backend needs")
            self.assertFalse([n for n in tried if "cuda" in n], tried)
        finally:
            sys.path.remove(vendor.name)
            vendor.cleanup()

    def test_without_a_vendor_plugin_the_options_are_empty_and_say_why(self):
        del os.environ["XLA_VMM_BACKEND"]
        fake_jax("vmm")
        pkg = fresh_package()
        fake_driver(pkg, loadable={"libcuda.so.1"})
        pkg.VENDOR_PACKAGES = (("jax_plugins.no_such_vendor", "x.so", "cuda"),)
        with self.assertLogs("jax_plugins.xla_vmm", level="WARNING") as logs:
            self.assertEqual(pkg._client_options(), {})
        self.assertIn("jax_plugins.no_such_vendor", logs.output[0])
        self.assertEqual(pkg.gpu_platform(), "cuda")

    def test_the_alias_can_be_turned_off(self):
        os.environ["XLA_VMM_GPU_ALIAS"] = "0"
        xb = fake_jax("vmm")
        pkg = fresh_package()
        pkg.initialize()
        self.assertNotIn("vmm", xb._alias_to_platforms)


class WithStandIns:
    """`initialize()` against a stand-in of JAX and of the loader (a mixin of the registration tests)."""

    def setUp(self):
        self.lib = tempfile.NamedTemporaryFile(suffix=".so")
        self.env = dict(os.environ)
        for v in ("XLA_VMM_BACKEND", "JAX_PLATFORMS", "XLA_VMM_HIP_LIBRARY", "XLA_VMM_VENDOR_PLUGIN",
                  "CUDA_VISIBLE_DEVICES", "XLA_VMM_GPU_ALIAS", "XLA_VMM_REPORT"):
            os.environ.pop(v, None)
        os.environ["XLA_VMM_LIBRARY"] = self.lib.name

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env)
        forget_jax()

    def start(self, platforms="", loadable=(), device=True, **jax):
        """(xla_bridge stand-in, package, libraries tried, log records) after initialize()."""
        xb = fake_jax(platforms, **jax)
        pkg = fresh_package()
        pkg.VENDOR_PACKAGES = (("jax_plugins.no_such_vendor", "x.so", "cuda"),)
        tried = fake_driver(pkg, loadable, device)
        with _Records() as records:
            pkg.initialize()
        return xb, pkg, tried, records

    def warnings(self, records):
        return [r.getMessage() for r in records if r.levelno >= 30]


class Registration(WithStandIns, unittest.TestCase):
    """Whether `initialize()` registers the plugin: when JAX_PLATFORMS does not name vmm, only if the
    backend can start and the jax is the supported one (JAX creates every registered plugin's client,
    so one that cannot start would break JAX); when it does, always, and the error at client creation
    says what is missing and what to set."""

    def test_without_the_driver_and_vmm_not_named_it_is_not_registered_and_says_so_quietly(self):
        for platforms in ("", "cpu", "cuda,cpu"):
            xb, pkg, tried, records = self.start(platforms)
            self.assertNotIn("vmm", xb._backend_factories, platforms)
            self.assertEqual(tried, ["libcuda.so.1", "libcuda.so"])
            self.assertEqual(self.warnings(records), [], "no warning on a machine without a GPU")
            [info] = [r.getMessage() for r in records]
            self.assertIn("libcuda.so.1 is not found", info)
            self.assertIn("XLA_VMM_BACKEND=host JAX_PLATFORMS=vmm", info)
            pkg.initialize()  # once per process
            self.assertNotIn("vmm", xb._backend_factories)

    def test_without_the_driver_and_vmm_named_creating_the_client_says_what_is_missing(self):
        for platforms in ("vmm", "vmm,cpu", "cpu,VMM"):
            os.environ["JAX_PLATFORMS"] = platforms  # JAX_PLATFORMS read from the environment too
            xb, _, _, records = self.start("" if platforms == "cpu,VMM" else platforms)
            self.assertIn("vmm", xb._backend_factories, platforms)
            self.assertEqual(self.warnings(records), [])
            with self.assertRaises(RuntimeError) as e:
                xb._backend_factories["vmm"].factory()
            message = str(e.exception)
            self.assertIn("the NVIDIA driver library libcuda.so.1 is not found", message)
            self.assertIn("set XLA_VMM_BACKEND=host", message)
            forget_jax()

    def test_a_driver_without_a_gpu_device_is_not_registered_unless_named(self):
        xb, _, _, records = self.start("", loadable={"libcuda.so.1"}, device=False)
        self.assertNotIn("vmm", xb._backend_factories)
        self.assertIn("no NVIDIA GPU device", records[0].getMessage())
        forget_jax()
        # Named: the plugin tries (the device check is JAX's heuristic, not a missing library).
        xb, _, _, _ = self.start("vmm", loadable={"libcuda.so.1"}, device=False)
        self.assertIn("vmm", xb._backend_factories)
        self.assertEqual(xb._backend_factories["vmm"].factory()[2], {})

    def test_cuda_visible_devices_hiding_every_gpu_is_not_a_gpu(self):
        for hidden in ("", "-1"):
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
            xb, _, _, records = self.start("", loadable={"libcuda.so.1"})
            self.assertNotIn("vmm", xb._backend_factories)
            self.assertIn("CUDA_VISIBLE_DEVICES", records[0].getMessage())
            forget_jax()

    def test_with_a_gpu_it_is_registered_without_being_named(self):
        xb, _, _, records = self.start("", loadable={"libcuda.so.1"})
        self.assertIn("vmm", xb._backend_factories)
        self.assertEqual(xb._backend_factories["vmm"].priority, 300, "never JAX's default backend")
        self.assertEqual(self.warnings(records), [])

    def test_the_host_backend_needs_nothing(self):
        os.environ["XLA_VMM_BACKEND"] = "host"
        xb, _, tried, records = self.start("")
        self.assertIn("vmm", xb._backend_factories)
        self.assertEqual(tried, [])
        self.assertEqual(xb._backend_factories["vmm"].factory()[2], {})
        forget_jax()
        # The client option wins over the environment, as in the plugin.
        os.environ["XLA_VMM_BACKEND"] = "cuda"
        xb, _, _, _ = self.start("", create_options="strict:true;backend:host")
        self.assertIn("vmm", xb._backend_factories)

    def test_hip_needs_the_hip_runtime(self):
        os.environ["XLA_VMM_BACKEND"] = "rocm"
        xb, _, tried, records = self.start("")
        self.assertNotIn("vmm", xb._backend_factories)
        self.assertEqual(tried[0], "libamdhip64.so.7")
        self.assertFalse([n for n in tried if "cuda" in n], tried)
        self.assertIn("XLA_VMM_HIP_LIBRARY", records[0].getMessage())
        forget_jax()
        xb, _, _, _ = self.start("", loadable={"libamdhip64.so.5"})
        self.assertIn("vmm", xb._backend_factories)
        forget_jax()
        # XLA_VMM_HIP_LIBRARY, a path, is the only one tried (as in the plugin).
        os.environ["XLA_VMM_HIP_LIBRARY"] = "/opt/x/libamdhip64.so"
        xb, _, tried, records = self.start("vmm", loadable={"libamdhip64.so.5"})
        self.assertEqual(tried, [], "named: the client's creation checks")
        with self.assertRaises(RuntimeError) as e:
            xb._backend_factories["vmm"].factory()
        self.assertEqual(tried, ["/opt/x/libamdhip64.so"])
        self.assertIn("XLA_VMM_HIP_LIBRARY=/opt/x/libamdhip64.so does not load", str(e.exception))
        self.assertIn("XLA_VMM_BACKEND=host", str(e.exception))

    def test_a_backend_the_plugin_refuses_is_not_registered_unless_named(self):
        os.environ["XLA_VMM_BACKEND"] = "tpu"
        xb, _, _, records = self.start("", loadable={"libcuda.so.1"})
        self.assertNotIn("vmm", xb._backend_factories)
        self.assertIn("'tpu' is not one of cuda, hip, host", records[0].getMessage())

    def test_another_jax_is_one_warning_or_named_an_error_with_the_fix(self):
        supported = supported_jax()
        fix = 'pip install "jax[cuda13]==%s"' % supported
        xb, _, _, records = self.start("", loadable={"libcuda.so.1"}, version="0.10.2",
                                       jaxlib_version="0.10.2")
        self.assertNotIn("vmm", xb._backend_factories)
        [warning] = self.warnings(records)
        self.assertEqual(len(records), 1)
        for text in ("jax 0.10.2", "jaxlib 0.10.2", "built for jax " + supported, fix):
            self.assertIn(text, warning)
        forget_jax()
        # Named: registered as a backend whose creation raises that (the library is not loaded).
        xb, _, _, records = self.start("vmm", loadable={"libcuda.so.1"}, version="0.10.2",
                                       jaxlib_version="0.10.2")
        self.assertEqual(self.warnings(records), [])
        registration = xb._backend_factories["vmm"]
        self.assertIsNone(registration.c_api, "the plugin library is not loaded into another jaxlib")
        self.assertFalse(registration.fail_quietly)
        with self.assertRaises(RuntimeError) as e:
            registration.factory()
        for text in ("jax 0.10.2", "built for jax " + supported, fix):
            self.assertIn(text, str(e.exception))

    def test_only_the_release_of_jax_and_jaxlib_counts(self):
        supported = supported_jax()
        xb, pkg, _, records = self.start("", loadable={"libcuda.so.1"}, version=supported + ".dev20260101")
        self.assertIn("vmm", xb._backend_factories)
        self.assertEqual(self.warnings(records), [])
        self.assertIsNone(pkg.version_problem({"jax": supported, "jaxlib": supported + "rc1"}))
        self.assertIn("jaxlib 0.10.0", pkg.version_problem({"jax": supported, "jaxlib": "0.10.0"}))
        self.assertIn("jax 1.0", pkg.version_problem({"jax": "1.0"}))


class _Records(logging.Handler):
    """The package logger's records (any level) while in the `with` block."""

    def __enter__(self):
        self.records = []
        self.logger = logging.getLogger("jax_plugins.xla_vmm")
        self.level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)
        return self.records

    def emit(self, record):
        self.records.append(record)

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


def load_runner():
    sys.path.insert(0, INTEGRATION)
    spec = importlib.util.spec_from_file_location("jax_tests", os.path.join(INTEGRATION, "jax_tests.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class ReportAtExit(WithStandIns, unittest.TestCase):
    """XLA_VMM_REPORT: report() written at exit for a script that cannot call it."""

    def test_registration_arms_it_and_only_when_asked(self):
        import atexit
        calls = []
        real = atexit.register
        atexit.register = lambda f, *a: calls.append((f.__name__, a))
        try:
            self.start("vmm", loadable=("libcuda.so.1",))
            os.environ["XLA_VMM_REPORT"] = "/tmp/r_%p.json"
            self.start("vmm", loadable=("libcuda.so.1",))
        finally:
            atexit.register = real
        self.assertEqual(calls, [("write_report", ("/tmp/r_%p.json", self.lib.name))])

    def test_the_report_goes_to_stderr_a_table_or_json_and_a_failure_is_a_warning(self):
        import contextlib
        import io
        pkg = fresh_package()
        data = {"programs": [{"program": "jit_step", "mode": "graph", "runner": "va-stable graph",
                              "steps": 7}], "devices": []}
        Report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        pkg.report = lambda library=None: Report(data)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            pkg.write_report("-")
        self.assertIn("jit_step", err.getvalue())
        with tempfile.TemporaryDirectory() as d:
            pkg.write_report(os.path.join(d, "r_%p.json"))
            with open(os.path.join(d, "r_%d.json" % os.getpid())) as fh:
                self.assertEqual(json.load(fh), data)
            pkg.write_report(os.path.join(d, "r.txt"))
            with open(os.path.join(d, "r.txt")) as fh:
                self.assertIn("va-stable graph", fh.read())
            with _Records() as records:
                pkg.write_report(os.path.join(d, "no", "such", "dir.json"))
            [w] = [r.getMessage() for r in records if r.levelno >= 30]
            self.assertIn("XLA_VMM_REPORT=", w)
            self.assertIn("could not be written", w)


class SliceRunner(unittest.TestCase):
    def test_logs_deaths_and_the_comparison(self):
        jt = load_runner()
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "x.jsonl")
            with open(log, "w") as f:
                for rec in [{"start": "t::a"}, {"id": "t::a", "outcome": "passed", "msg": ""},
                            {"start": "t::b"}, {"id": "t::b", "outcome": "failed", "msg": "E: 3 != 4"},
                            {"start": "t::c"}]:
                    f.write(json.dumps(rec) + "\n")
                f.write('{"id": "t::c", "outc')  # cut by a death
            outcomes, started = jt.read_log(log)
            self.assertEqual(set(outcomes), {"t::a", "t::b"})
            self.assertEqual(started[-1], "t::c")
        self.assertEqual(jt.died_reason(-11, False), "killed by SIGSEGV")
        self.assertIn("hung", jt.died_reason(0, True))
        self.assertEqual(jt.normalize("shape f32[12,3] at 0x7f00ab"), "shape fN[N,N] at ADDR")
        words = jt.last_words("a\nb\nterminate called after throwing\nFatal Python error: Aborted\n")
        self.assertEqual(words[0], "terminate called after throwing")
        results = {
            ("f", "cuda"): {"outcomes": {"a": ("passed", ""), "b": ("passed", ""), "c": ("failed", "x")},
                            "deaths": [], "fallback_lines": 0, "cut": False},
            ("f", "vmm"): {"outcomes": {"a": ("passed", ""), "b": ("died", "killed by SIGABRT")},
                           "deaths": [{"id": "b", "why": "killed by SIGABRT", "words": []}],
                           "fallback_lines": 2, "cut": False},
        }
        rows, groups = jt.compare(results, ["f"], "cuda", "vmm")
        self.assertEqual(rows[0]["ref_pass_dut_not"], 1)
        self.assertEqual(rows[0]["ref_pass_dut_pass"], 1)
        self.assertEqual(list(groups.values()), [["b"]])
        md = jt.markdown(rows, groups, results, "cuda", "vmm", "t")
        self.assertIn("Of 2 tests that pass on cuda, 1 (50.00%) pass on vmm", md)


    def test_fallback_warnings_are_counted_by_reason(self):
        jt = load_runner()
        warn = ("W xla_vmm_plugin::objects::executable: xla-vmm runtime rejected jit_f ({}); it runs on the vendor "
                "runtime on xla-vmm buffers (set strict to make this an error)")
        host = "unsupported: host_execute_start thunk '…': thunk kind not executed by this runtime"
        text = "\n".join([
            warn.format("unsupported: custom call 'xla_ffi_python_gpu_callback': custom call "
                        "'xla_ffi_python_gpu_callback'"),
            jt.START_MARKER + "memories_test.py::ComputeOffload::test_compute_on_basic",
            warn.format("unsupported: host_execute_start thunk 'host-call.cloned.1.call-start.1': thunk "
                        "kind not executed by this runtime"),
            jt.START_MARKER + "memories_test.py::ComputeOffload::test_compute_on_2d",
            warn.format("unsupported: host_execute_start thunk 'host-call.7.call-start': thunk kind not "
                        "executed by this runtime"),
            "an unrelated line",
            "the program falls back to the vendor runtime",
        ])
        n, reasons, tests = jt.fallbacks_in(text)
        self.assertEqual(n, 4)
        self.assertEqual(reasons[host], 2)
        self.assertEqual(sum(reasons.values()), 4)
        self.assertTrue(any(r.startswith("other: ") for r in reasons))
        # Each warning is put on the test running when it came (none before the first marker).
        self.assertEqual(tests[host], ["memories_test.py::ComputeOffload::test_compute_on_basic",
                                       "memories_test.py::ComputeOffload::test_compute_on_2d"])
        self.assertEqual(tests[[r for r in reasons if "python_gpu_callback" in r][0]], [])
        # Merged over shards and tabled per reason, with the files they came from.
        m = jt.merge_shards([
            {"outcomes": {}, "deaths": [], "fallback_lines": 2, "fallback_reasons": {"r1": 2},
             "fallback_tests": {"r1": ["f.py::A::test_one"]}, "cut": False},
            {"outcomes": {}, "deaths": [], "fallback_lines": 1, "fallback_reasons": {"r1": 1, "r2": 1},
             "fallback_tests": {"r1": ["f.py::A::test_one", "f.py::A::test_two"]}, "cut": False},
            {"outcomes": {}, "deaths": [], "fallback_lines": 0, "cut": False},  # an older result
        ])
        self.assertEqual(m["fallback_reasons"], {"r1": 3, "r2": 1})
        self.assertEqual(m["fallback_tests"], {"r1": ["f.py::A::test_one", "f.py::A::test_two"]})
        results = {("f", "cuda"): {"outcomes": {}, "deaths": [], "fallback_lines": 0, "cut": False},
                   ("f", "vmm"): m}
        rows, groups = jt.compare(results, ["f"], "cuda", "vmm")
        md = jt.markdown(rows, groups, results, "cuda", "vmm", "t")
        self.assertIn("## Fallback warnings on vmm, by reason", md)
        self.assertIn("| 3 | r1 | f 3 | `test_one`, `test_two` |", md)

    def test_shards_split_a_file_and_merge_into_one_result(self):
        jt = load_runner()
        self.assertEqual(jt.parse_shards("api_test=4, lax_test.py=3,x=0"), {"api_test": 4, "lax_test": 3, "x": 1})
        parts = [{"outcomes": {"a": ("passed", "")}, "deaths": [], "fallback_lines": 1, "cut": False},
                 {"outcomes": {"b": ("died", "killed by SIGSEGV")},
                  "deaths": [{"id": "b", "why": "killed by SIGSEGV", "words": []}], "fallback_lines": 2, "cut": True}]
        m = jt.merge_shards(parts)
        self.assertEqual(set(m["outcomes"]), {"a", "b"})
        self.assertEqual((len(m["deaths"]), m["fallback_lines"], m["cut"]), (1, 3, True))
        # The plugin keeps positions i, i + k, ... of the collection, then drops the skipped ones.
        sys.path.insert(0, os.path.join(INTEGRATION, "jaxslice"))
        try:
            plugin = importlib.import_module("plugin")
        finally:
            sys.path.pop(0)
        self.assertEqual(plugin.shard_of("1/3"), (1, 3))
        self.assertEqual(plugin.shard_of(None), (0, 1))
        self.assertEqual(plugin.shard_of("3/3"), (0, 1))

        class Item:
            def __init__(self, n):
                self.nodeid = "t::%d" % n
        deselected = []
        config = types.SimpleNamespace(hook=types.SimpleNamespace(
            pytest_deselected=lambda items: deselected.extend(i.nodeid for i in items)))
        with tempfile.NamedTemporaryFile("w", suffix=".skip", delete=False) as f:
            f.write("t::4\n")
        env = dict(os.environ)
        try:
            os.environ.update(JAXSLICE_SHARD="1/3", JAXSLICE_SKIP=f.name)
            items = [Item(n) for n in range(9)]
            plugin.pytest_collection_modifyitems(None, config, items)
        finally:
            os.environ.clear()
            os.environ.update(env)
            os.remove(f.name)
        self.assertEqual([i.nodeid for i in items], ["t::1", "t::7"])
        self.assertEqual(len(deselected), 7)

    def test_a_cut_file_continues_where_it_stopped(self):
        jt = load_runner()
        earlier = {"outcomes": {"t::a": ["passed", ""], "t::b": ["died", "killed by SIGSEGV"],
                                "t::c": ["failed", "E"]},
                   "deaths": [{"id": "t::b", "why": "killed by SIGSEGV", "words": []}],
                   "fallback_lines": 3, "fallback_tests": {"r": ["t::a"]}, "cut": True}
        with tempfile.TemporaryDirectory() as d:
            log, skip = os.path.join(d, "f.jsonl"), os.path.join(d, "f.skip")
            deaths, fallbacks, reasons, tests = jt.seed(log, skip, earlier)
            self.assertEqual((len(deaths), fallbacks, reasons, tests), (1, 3, {}, {"r": ["t::a"]}))
            outcomes, _ = jt.read_log(log)
            self.assertEqual(outcomes, {"t::a": ("passed", ""), "t::c": ("failed", "E")})
            with open(skip) as f:
                self.assertEqual(set(f.read().split()), {"t::a", "t::b", "t::c"})
            # Without an earlier result: empty, and no stale files left.
            self.assertEqual(jt.seed(log, skip, None), ([], 0, {}, {}))
            self.assertFalse(os.path.exists(log) or os.path.exists(skip))



class FfiRegistrationTest(unittest.TestCase):
    """The package's hand-over of jaxlib's FFI handlers to the plugin (`_Ffi`, `_forward_registrations`),
    against a stand-in of the plugin library and of jaxlib's xla_client."""

    def setUp(self):
        import ctypes

        self.pkg = fresh_package()
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = lambda address: new(address, None, None)
        self.calls = []
        test = self

        class Lib:
            def xla_vmm_ffi_register_handler(self, name, length, execute, instantiate, traits):
                test.calls.append(("handler", name[:length].decode(), execute, instantiate, traits))
                return 0

            def xla_vmm_ffi_register_type(self, type_id, type_info):
                test.calls.append(("type", type_id, type_info))
                return 0

            def xla_vmm_stats_free(self, p):
                test.calls.append(("free", p))

        self.ffi = self.pkg._Ffi.__new__(self.pkg._Ffi)
        self.ffi.lib = Lib()

    def test_stages_and_plain_capsules_are_handed_over_with_their_pointers(self):
        self.assertTrue(self.ffi.handler("cb", {"execute": self.capsule(0x1000),
                                                "instantiate": self.capsule(0x2000)}))
        self.assertTrue(self.ffi.handler("plain", self.capsule(0x3000), traits=1))
        self.assertEqual(self.calls, [("handler", "cb", 0x1000, 0x2000, -1),
                                      ("handler", "plain", 0x3000, None, 1)])

    def test_stages_the_plugin_does_not_run_are_not_registered(self):
        with self.assertLogs("jax_plugins.xla_vmm", "WARNING"):
            self.assertFalse(self.ffi.handler("x", {"execute": self.capsule(0x1000),
                                                    "prepare": self.capsule(0x2000)}))
        with self.assertLogs("jax_plugins.xla_vmm", "WARNING"):
            self.assertFalse(self.ffi.handler("y", {"instantiate": self.capsule(0x1000)}))
        self.assertEqual(self.calls, [])

    def test_types_are_handed_over_and_malformed_ones_skipped(self):
        self.assertTrue(self.ffi.type("T", {"type_id": self.capsule(0x10), "type_info": self.capsule(0x20)}))
        self.assertFalse(self.ffi.type("U", {"type_id": self.capsule(0x10)}))
        self.assertEqual(self.calls, [("type", 0x10, 0x20)])

    def test_later_typed_ffi_registrations_reach_the_vendor_and_us(self):
        seen = []
        xc = types.ModuleType("jax._src.lib.xla_client")
        xc._custom_callback_handler = {"CUDA": lambda *a: seen.append(a)}
        lib = types.ModuleType("jax._src.lib")
        lib.xla_client = xc
        sys.modules.update({"jax._src.lib": lib, "jax._src.lib.xla_client": xc})
        try:
            self.pkg._forward_registrations(self.ffi, "CUDA")
            cap = self.capsule(0x4000)
            xc._custom_callback_handler["CUDA"]("mine", cap, "CUDA", 1, 0)
            xc._custom_callback_handler["CUDA"]("legacy", cap, "CUDA", 0, 0)
        finally:
            for m in ("jax._src.lib", "jax._src.lib.xla_client"):
                sys.modules.pop(m, None)
        self.assertEqual([a[0] for a in seen], ["mine", "legacy"])
        self.assertEqual(self.calls, [("handler", "mine", 0x4000, None, 0)])


class HostComputeRegistrationTest(unittest.TestCase):
    """The package's CPU compiler for host-offloaded compute (`_host_compute`): what it hands the
    plugin library, and that its two C callbacks answer every failure with a message instead of
    raising into C."""

    def setUp(self):
        pkg = fresh_package()
        self.hc = importlib.import_module(pkg.__name__ + "._host_compute")
        self.hc._instance = None
        self.calls = []
        test = self

        def register(load, run):
            test.calls.append((load.value, run.value))
            return 0

        # The package's _Ffi over a stand-in library: a plain function (ctypes sets restype / argtypes
        # on it, as on a CDLL's).
        self.lib = pkg._Ffi.__new__(pkg._Ffi)
        self.lib.lib = types.SimpleNamespace(xla_vmm_host_compute_register=register,
                                             xla_vmm_stats_free=lambda p: None)

    def test_two_callbacks_are_registered_and_kept_alive(self):
        self.assertTrue(self.hc.register(self.lib))
        [(load, run)] = self.calls
        self.assertTrue(load and run and load != run)
        self.assertEqual(load, ctypes_address(self.hc._instance.load_fn))
        self.assertFalse(self.hc.register(object()))  # a library without the entry point

    def test_callback_failures_come_back_as_messages(self):
        import ctypes

        self.hc.register(self.lib)
        load = self.hc.LOAD(self.calls[0][0])
        run = self.hc.RUN(self.calls[0][1])
        err = ctypes.create_string_buffer(64)
        module = b"not an HloModuleProto"
        handle = ctypes.c_uint64(0)
        self.assertNotEqual(load(module, len(module), None, 0, ctypes.byref(handle), err, 64), 0)
        self.assertTrue(err.value, "no message")
        err = ctypes.create_string_buffer(64)
        self.assertNotEqual(run(12345, None, 0, 0, err, 64), 0)
        self.assertIn(b"no host computation 12345", err.value)
        self.assertLess(len(err.value), 64)


def ctypes_address(fn):
    import ctypes

    return ctypes.cast(fn, ctypes.c_void_p).value


if __name__ == "__main__":
    unittest.main()


class ReportTableTest(unittest.TestCase):
    """``str(report())``'s memory lines, from the report's data as the plugin returns it."""

    def device(self, **memory):
        m = {"device_bytes": 2 << 30, "host_bytes": 3 << 30, "spilled": 4, "limits": {"device": 4 << 30}}
        m.update(memory)
        return {"programs": [], "devices": [{"device": 0, "memory": m}]}

    def test_moves_for_the_programs_plans_are_said_when_there_were_any(self):
        fresh_package()
        report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        text = str(report(self.device(relocated=3)))
        self.assertIn("4 allocations past the device budget, 3 moved for their programs' plans", text)
        self.assertIn("(limit 4.00 GiB)", text)
        for quiet in (self.device(relocated=0), self.device()):
            self.assertNotIn("moved", str(report(quiet)))

    def test_the_library_plans_line_counts_ffts_and_reads_an_older_plugin(self):
        fresh_package()
        report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        d = self.device()
        d["devices"][0]["library_plans"] = {"gemm": 5, "conv": 1, "fft": 2}
        self.assertIn("5 GEMM, 1 convolution and 2 FFT plans held by loaded programs", str(report(d)))
        # A plugin from before FFT plans were counted says none.
        d["devices"][0]["library_plans"] = {"gemm": 5, "conv": 1}
        self.assertIn("5 GEMM, 1 convolution and 0 FFT plans", str(report(d)))

    def test_a_staged_program_says_what_stays_and_what_the_step_before_fetches(self):
        fresh_package()
        report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        staging = {"staged": 6, "staged_bytes": 6 << 20, "area_bytes": 4 << 20, "kept": 1, "kept_bytes": 1 << 20,
                   "carried": 2, "carried_bytes": 2 << 20, "in_place": 1, "in_place_bytes": 1 << 20,
                   "bytes_in_per_step": 5 << 20, "bytes_out_per_step": 0}
        d = {"programs": [{"program": "jit_f", "mode": "graph", "runner": "va-stable graph", "steps": 3,
                           "staging": staging}], "devices": []}
        text = str(report(d))
        self.assertIn("(1, 1.0 MiB, kept there from step to step; 2, 2.0 MiB, fetched by the step before)", text)
        # A plugin from before the step before fetched anything says none.
        for k in ("carried", "carried_bytes"):
            del staging[k]
        self.assertIn("; 0, 0.0 MiB, fetched by the step before", str(report(d)))
        # A program with memory in host memory that is not staged says why.
        d["programs"].append({"program": "jit_g", "mode": "graph", "runner": "eager", "steps": 1,
                              "staging_note": "nothing pays to stage"})
        self.assertIn("jit_g: part in host memory, not staged (nothing pays to stage)", str(report(d)))

    def test_programs_dropped_are_rows_marked_dropped_and_the_total_is_said(self):
        fresh_package()
        report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        row = lambda name, steps: {"program": name, "mode": "graph", "runner": "va-stable graph",  # noqa: E731
                                   "steps": steps}
        d = {"programs": [row("jit_live", 5)], "dropped": [row("jit_train_step", 20)], "dropped_total": 3,
             "devices": []}
        text = str(report(d))
        self.assertRegex(text, r"jit_train_step \(dropped\)\s+graph\s+va-stable graph\s+20")
        self.assertNotIn("jit_live (dropped)", text)
        self.assertIn("(3 programs dropped in all; the last 1 are listed)", text)
        d["dropped_total"] = 1
        self.assertNotIn("dropped in all", str(report(d)))

    def test_under_a_device_budget_each_program_says_its_own_memory(self):
        fresh_package()
        report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        mem = {"device_bytes": 4 << 20, "host_bytes": 2 << 20, "shared_bytes": 16 << 20}
        limits = {"device": 1 << 30}
        usage = {"device_bytes": 1 << 29, "host_bytes": 0, "spilled": 0, "limits": limits}
        d = {"programs": [{"program": "jit_init", "mode": "graph", "runner": "eager", "steps": 1, "memory": mem}],
             "devices": [{"device": "cuda 0", "memory": usage,
                          "shared_temporaries": {"memories": 2, "bytes": 60 << 20}}]}
        text = str(report(d))
        self.assertIn("jit_init: its own memory 4.0 MiB on the device, 2.0 MiB in host memory; it maps 16.0 MiB of "
                      "temporaries shared with other programs", text)
        self.assertIn("device cuda 0: 2 memories (60.0 MiB) of temporaries shared by loaded programs", text)
        # Without a device budget the per-program lines are left out.
        limits["device"] = None
        self.assertNotIn("its own memory", str(report(d)))

    def test_the_guard_line_says_the_second_look(self):
        fresh_package()
        report = importlib.import_module("jax_plugins.xla_vmm._stats").Report
        guard = {"runner": "va-stable", "decided_at_step": 16, "va_stable_us": 3515.0, "recapture_us": 3702.0,
                 "eager_us": 6228.0, "samples": [3, 3, 2], "second_look": None}
        d = {"programs": [{"program": "jit_step", "mode": "graph", "runner": "va-stable graph", "steps": 40,
                           "guard": guard}], "devices": []}
        self.assertIn("guard at step 16: va-stable 3.515, recapture 3.702, eager 6.228 ms", str(report(d)))
        self.assertNotIn("second look", str(report(d)))
        guard.update(runner="recapture", second_look={"decided_at_step": 34, "va_stable_us": 3480.0,
                                                      "recapture_us": 3270.0})
        self.assertIn("; second look at step 34: va-stable 3.480, recapture 3.270 ms", str(report(d)))
        # Kept eager: the second look measured eager, not the VA-stable graph.
        guard["second_look"].update(va_stable_us=None, eager_us=3550.0)
        self.assertIn("; second look at step 34: eager 3.550, recapture 3.270 ms", str(report(d)))
        guard["second_look"].update(va_stable_us=3480.0, eager_us=None)
        # A recapture program that captures at most steps says how often.
        d["programs"][0].update(runner="graph-recapture", graph_captures=30)
        self.assertIn("captured 30 times in 40 steps; guard at step 16", str(report(d)))
        d["programs"][0].update(graph_captures=2)
        self.assertNotIn("captured", str(report(d)))
        # Eager left out of the trial: the line says why.
        guard.update(eager_us=None, samples=[3, 3, 0], eager_skipped=True, second_look=None)
        self.assertIn("guard at step 16: va-stable 3.515, recapture 3.702 ms (eager not sampled: recapture replayed "
                      "one graph)", str(report(d)))
        # Recapture replayed in its trial (tried first): nothing else was tried.
        guard.update(runner="recapture", decided_at_step=5, va_stable_us=None, samples=[0, 3, 0],
                     va_stable_skipped=True)
        self.assertIn("guard at step 5: recapture 3.702 ms (replayed one graph: va-stable and eager not tried)",
                      str(report(d)))
        # Then it kept capturing: the VA-stable graph took the program.
        guard.update(runner="va-stable", recapture_gave_way_at_step=40)
        self.assertIn("; recapture kept capturing: va-stable from step 40", str(report(d)))
