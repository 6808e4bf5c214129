"""The JAX-facing logic that needs no GPU and no jax: the `jax_plugins.xla_vmm` package's
registration (the "cuda" alias under JAX_PLATFORMS=vmm) against a stand-in of JAX's
xla_bridge tables, and the JAX test-slice runner's bookkeeping (logs, deaths, comparison).

    python3 -m unittest discover -s integration/unit -v
"""
import dataclasses
import importlib
import json
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


def fake_jax(platforms):
    """Stand-ins of the two jax modules the package touches, in sys.modules."""
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
    cfg = types.ModuleType("jax._src.config")
    cfg.jax_platforms = types.SimpleNamespace(value=platforms)
    src = types.ModuleType("jax._src")
    src.xla_bridge, src.config = xb, cfg
    jax = types.ModuleType("jax")
    jax._src = src
    sys.modules.update({"jax": jax, "jax._src": src, "jax._src.xla_bridge": xb,
                        "jax._src.config": cfg})
    return xb


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
        for m in [m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jax_plugins"))]:
            del sys.modules[m]

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
            if pkg.vendor_plugin()[1] != "rocm":
                self.skipTest("a CUDA vendor plugin is installed here (it is preferred)")
            pkg.initialize()
            self.assertEqual(xb._alias_to_platforms["vmm"], ["vmm", "rocm"])
            self.backends(xb, ["vmm", "rocm"])
            self.assertIs(xb._backends["rocm"], xb._backends["vmm"])
            options = xb._backends["vmm"][2]
            self.assertEqual(options["backend"], "hip")
            self.assertTrue(options["vendor_plugin_path"].endswith("xla_rocm7/xla_rocm_plugin.so"))
        finally:
            sys.path.remove(vendor.name)
            vendor.cleanup()

    def test_without_a_vendor_plugin_the_options_are_empty_and_say_why(self):
        del os.environ["XLA_VMM_BACKEND"]
        fake_jax("vmm")
        pkg = fresh_package()
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


def load_runner():
    sys.path.insert(0, INTEGRATION)
    spec = importlib.util.spec_from_file_location("jax_tests", os.path.join(INTEGRATION, "jax_tests.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


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
        warn = ("W xla_vmm_plugin::executable: xla-vmm runtime rejected jit_f ({}); it runs on the vendor "
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
