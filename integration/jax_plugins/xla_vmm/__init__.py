"""xla-vmm as a JAX PJRT plugin, registered under the name ``vmm``.

JAX finds this module through the ``jax_plugins`` entry point (or the
``jax_plugins`` namespace package) and calls :func:`initialize`. Then::

    JAX_PLATFORMS=vmm python your_script.py

Client options come from ``jax.config.jax_pjrt_client_create_options``
(``"strict:true;xla_vmm_tmp_copy_threshold:0"``) or the environment
(``XLA_VMM_STRICT``, ``XLA_VMM_TMP_COPY_THRESHOLD``, ``XLA_VMM_BACKEND``,
``XLA_VMM_VENDOR_PLUGIN``). The shared library is the one bundled in this
package directory, or ``XLA_VMM_LIBRARY`` when set.

The vendor XLA GPU plugin (the compiler) is found here, through importlib
(the installed ``jax_plugins.xla_cuda13`` / ``xla_cuda12`` / ROCm package of
this interpreter), and passed as the ``vendor_plugin_path`` client option; a
``vendor_plugin_path`` in ``jax_pjrt_client_create_options`` or
``XLA_VMM_VENDOR_PLUGIN`` wins over it.

Installing the package never breaks JAX: JAX creates the client of every
registered plugin when ``JAX_PLATFORMS`` is unset, so when ``vmm`` is not named
in ``JAX_PLATFORMS`` (or ``jax.config.jax_platforms``) the plugin is
registered only if its backend can start (``XLA_VMM_BACKEND=host``: always;
``hip``: the HIP runtime loads; ``cuda``, the default: the NVIDIA driver
library ``libcuda.so.1`` loads and a GPU device node is there) and the
installed jax is the one it is built for (:data:`JAX_VERSION`). When ``vmm``
is named, a missing driver or another jax is an error at the first use of
the backend that says what is missing and what to set or install.

``XLA_VMM_REPORT`` (read once, at registration): at the process's exit, write
:func:`report` for a script that cannot call it (MaxText's trainer, say):
``-`` prints its table on stderr, a path ending in ``.json`` gets its data,
any other path its table; ``%p`` in the path is the process id.
"""

import atexit
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

PLUGIN_NAME = "vmm"
LIBRARY_NAME = "xla_vmm_plugin.so"
# The jax (and jaxlib) release this plugin is built for: its PJRT C API, its vendor plugin, the
# private jax tables the package touches. pyproject.toml pins the same (`jax==`).
JAX_VERSION = "0.11.2"
# Vendor plugin packages, in preference order, the library each holds and JAX's name of its platform.
VENDOR_PACKAGES = (
    ("jax_plugins.xla_cuda13", "xla_cuda_plugin.so", "cuda"),
    ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so", "cuda"),
    ("jax_plugins.xla_rocm7", "xla_rocm_plugin.so", "rocm"),
    ("jax_plugins.xla_rocm6", "xla_rocm_plugin.so", "rocm"),
)
_registered = False


def library_path():
    """Path of the plugin shared library, or None when there is none."""
    env = os.environ.get("XLA_VMM_LIBRARY")
    if env:
        return env if os.path.isfile(env) else None
    bundled = Path(__file__).resolve().parent / LIBRARY_NAME
    return str(bundled) if bundled.is_file() else None


def _package_dirs(name):
    """Directories of package `name` (without importing it), or []."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin).parent] if spec.origin else []


def vendor_plugin():
    """(library path, JAX platform "cuda" or "rocm") of the installed vendor XLA GPU plugin of this
    interpreter, or None."""
    for package, library, platform in VENDOR_PACKAGES:
        for d in _package_dirs(package):
            candidate = d / library
            if candidate.is_file():
                return str(candidate), platform
    return None


def vendor_plugin_path():
    """The installed vendor XLA GPU plugin library of this interpreter, or None."""
    found = vendor_plugin()
    return found[0] if found else None


def gpu_platform():
    """JAX's name of the GPU platform vmm stands for: "rocm" with the HIP backend (XLA_VMM_BACKEND=hip)
    or a ROCm vendor plugin installed, else "cuda"."""
    backend = os.environ.get("XLA_VMM_BACKEND", "").strip()
    if backend in ("hip", "rocm"):
        return "rocm"
    if backend in ("cuda", "gpu", "host"):
        return "cuda"
    found = vendor_plugin()
    return found[1] if found else "cuda"


# jaxlib's GPU plugin extension modules (their FFI handlers: host callbacks, buffer callbacks), in
# preference order, and XLA's name of their platform.
FFI_EXTENSIONS = (
    ("jax_cuda13_plugin.cuda_plugin_extension", "CUDA"),
    ("jax_cuda12_plugin.cuda_plugin_extension", "CUDA"),
    ("jaxlib.cuda.cuda_plugin_extension", "CUDA"),
    ("jax_rocm7_plugin.rocm_plugin_extension", "ROCM"),
    ("jax_rocm6_plugin.rocm_plugin_extension", "ROCM"),
)
# jaxlib's GPU kernel modules whose typed-FFI targets (cuSOLVER, cuSPARSE, linalg, PRNG) jax registers
# with the vendor plugin at import; each has `registrations()`: {platform: [(name, fn, api_version)]}.
FFI_MODULES = ("jaxlib.gpu_solver", "jaxlib.gpu_linalg", "jaxlib.gpu_sparse", "jaxlib.gpu_prng")
_ffi_registered = False


def _capsule_pointer(capsule):
    """The pointer a PyCapsule holds (whatever its name)."""
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))


class _Ffi:
    """The plugin library's FFI registration entry points (ctypes)."""

    def __init__(self, library):
        import ctypes

        self.lib = ctypes.CDLL(library)
        self.lib.xla_vmm_ffi_register_handler.restype = ctypes.c_void_p
        self.lib.xla_vmm_ffi_register_handler.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ]
        self.lib.xla_vmm_ffi_register_type.restype = ctypes.c_void_p
        self.lib.xla_vmm_ffi_register_type.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.xla_vmm_stats_free.restype = None
        self.lib.xla_vmm_stats_free.argtypes = [ctypes.c_void_p]

    def _check(self, err, what):
        import ctypes

        if err:
            try:
                message = ctypes.string_at(err).decode(errors="replace")
            finally:
                self.lib.xla_vmm_stats_free(err)
            logger.warning("xla-vmm: FFI %s: %s", what, message)
            return False
        return True

    def handler(self, name, fn, traits=-1):
        """Register `fn` (a capsule, or jaxlib's dict of stages) as `name`'s typed-FFI handler."""
        stages = fn if isinstance(fn, dict) else {"execute": fn}
        if "execute" not in stages:
            logger.warning("xla-vmm: FFI handler %s has no execute stage; not registered", name)
            return False
        unserved = sorted(set(stages) - {"execute", "instantiate"})
        if unserved:
            logger.warning("xla-vmm: FFI handler %s has stages %s that xla-vmm does not run; "
                           "not registered (its programs run on the vendor runtime)", name, unserved)
            return False
        encoded = name.encode()
        execute = _capsule_pointer(stages["execute"])
        instantiate = _capsule_pointer(stages["instantiate"]) if "instantiate" in stages else None
        return self._check(
            self.lib.xla_vmm_ffi_register_handler(encoded, len(encoded), execute, instantiate, traits),
            f"handler {name}")

    def type(self, name, value):
        """Register an FFI type's deleter (jaxlib's {"type_id": capsule, "type_info": capsule})."""
        if not isinstance(value, dict) or "type_id" not in value or "type_info" not in value:
            return False
        return self._check(
            self.lib.xla_vmm_ffi_register_type(
                _capsule_pointer(value["type_id"]), _capsule_pointer(value["type_info"])),
            f"type {name}")


def _register_ffi_handlers():
    """Give the plugin jaxlib's GPU FFI handlers (host callbacks, buffer callbacks) and a CPU
    compiler for host-offloaded compute, so that programs with them run on xla-vmm's runtime, and
    pass on later typed-FFI registrations for the GPU
    platform (``jax.ffi.register_ffi_target(..., platform="CUDA")``). Once per process."""
    global _ffi_registered
    if _ffi_registered:
        return
    _ffi_registered = True
    path = library_path()
    if path is None:
        return
    try:
        ffi = _Ffi(path)
    except (OSError, AttributeError) as e:
        logger.warning("xla-vmm: FFI registration unavailable (%s)", e)
        return
    # Host-offloaded compute (compute_on("device_host")) through this jaxlib's CPU compiler.
    from . import _host_compute

    if not _host_compute.register(ffi):
        logger.warning("xla-vmm: host-offloaded compute is not available to the runtime")
    for module, platform in FFI_EXTENSIONS:
        try:
            ext = importlib.import_module(module)
        except ImportError:
            continue
        types = ext.ffi_types() if hasattr(ext, "ffi_types") else {}
        for name, value in types.items():
            ffi.type(name, value)
        handlers = ext.ffi_handlers() if hasattr(ext, "ffi_handlers") else {}
        done = [name for name, fn in handlers.items() if ffi.handler(name, fn)]
        for kernels in FFI_MODULES:
            try:
                registrations = importlib.import_module(kernels).registrations().get(platform, [])
            except (ImportError, AttributeError):
                continue
            done += [name for name, fn, api_version in registrations
                     if api_version == 1 and ffi.handler(name, fn)]
        logger.debug("xla-vmm: FFI handlers of %s: %s", module, done)
        _forward_registrations(ffi, platform)
        break


def _forward_registrations(ffi, platform):
    """Wrap jaxlib's custom call handler of `platform` so that typed-FFI targets registered from now
    on reach xla-vmm too (the vendor plugin keeps getting them)."""
    try:
        from jax._src.lib import xla_client
    except ImportError:
        return
    handlers = getattr(xla_client, "_custom_callback_handler", None)
    if not isinstance(handlers, dict) or platform not in handlers:
        return
    vendor = handlers[platform]

    def both(name, fn, xla_platform_name, api_version, traits):
        vendor(name, fn, xla_platform_name, api_version, traits)
        if api_version == 1:
            ffi.handler(name if isinstance(name, str) else name.decode(), fn, int(traits))

    handlers[platform] = both


def _client_options():
    """Client options from this package (JAX adds jax_pjrt_client_create_options on top). Raises,
    with what is missing and what to set, when the backend's driver library is not there (JAX
    then fails with that message instead of the plugin's)."""
    problem = backend_problem(device_nodes=False)
    if problem:
        raise RuntimeError(f"xla-vmm: the 'vmm' backend cannot start: {problem}. To run without a "
                           f"GPU set {HOST_HINT}; or leave vmm out of JAX_PLATFORMS")
    if _alias_platform:
        _install_gpu_alias(_alias_platform)
    if os.environ.get("XLA_VMM_VENDOR_PLUGIN"):
        _register_ffi_handlers()
        return {}  # the plugin reads it itself
    if os.environ.get("XLA_VMM_BACKEND", "").strip() == "host":
        return {}  # no GPU: no compiler wanted
    found = vendor_plugin()
    if found is None:
        logger.warning(
            "xla-vmm: no vendor XLA GPU plugin package (%s) for this python; install "
            "jax[cuda13] or set XLA_VMM_VENDOR_PLUGIN",
            ", ".join(p for p, _, _ in VENDOR_PACKAGES),
        )
        return {}
    _register_ffi_handlers()
    path, platform = found
    logger.debug("xla-vmm: vendor plugin %s (%s)", path, platform)
    options = {"vendor_plugin_path": path}
    if platform == "rocm" and not os.environ.get("XLA_VMM_BACKEND"):
        options["backend"] = "hip"  # the HIP backend under the ROCm compiler
    return options


# What the client's backend needs: the HIP runtime as the plugin looks for it (ffi/src/hip/runtime.rs;
# XLA_VMM_HIP_LIBRARY, a path, replaces the list), and the NVIDIA driver (cudarc's names).
HIP_LIBRARIES = ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so",
                 "/opt/rocm/lib/libamdhip64.so")
CUDA_LIBRARIES = ("libcuda.so.1", "libcuda.so")
# Device nodes of an NVIDIA GPU (JAX's own test before it creates its CUDA client).
NVIDIA_DEVICES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
HOST_SETTING = "XLA_VMM_BACKEND=host"
HOST_HINT = HOST_SETTING + " (the host backend: no GPU; buffers and copies only, for tests)"


def _loads(names):
    """The first of `names` that the dynamic loader opens, or None (nothing is called in it)."""
    import ctypes

    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


def _create_options():
    """jax.config.jax_pjrt_client_create_options as a dict ("key:value;key:value"), or {}."""
    try:
        from jax._src import config

        value = config.jax_pjrt_client_create_options.value
    except (ImportError, AttributeError):
        return {}
    if isinstance(value, dict):
        return value
    pairs = [item.split(":", 1) for item in (value or "").split(";") if ":" in item]
    return {k.strip(): v.strip() for k, v in pairs}


def chosen_backend():
    """The device backend the client would use: "cuda", "hip", "host" or a name the plugin refuses.
    As the plugin decides: the ``backend`` client option, else ``XLA_VMM_BACKEND``, else "hip" under a
    ROCm vendor plugin (see _client_options), else "cuda"."""
    backend = str(_create_options().get("backend", "")).strip()
    if not backend:
        backend = os.environ.get("XLA_VMM_BACKEND", "").strip()
    if not backend and not os.environ.get("XLA_VMM_VENDOR_PLUGIN"):
        found = vendor_plugin()
        backend = "hip" if found and found[1] == "rocm" else ""
    return {"": "cuda", "gpu": "cuda", "rocm": "hip"}.get(backend, backend)


def backend_problem(backend=None, device_nodes=True):
    """Why the client's backend (`backend`, default :func:`chosen_backend`) cannot start on this
    machine, or None. Only loads libraries (no device context is created). `device_nodes`: for
    "cuda", also want an NVIDIA GPU device node (as JAX does before creating its CUDA client)."""
    backend = chosen_backend() if backend is None else backend
    if backend == "host":
        return None
    if backend == "hip":
        explicit = os.environ.get("XLA_VMM_HIP_LIBRARY")
        if explicit:
            if _loads([explicit]) is None:
                return f"the HIP runtime XLA_VMM_HIP_LIBRARY={explicit} does not load"
            return None
        if _loads(HIP_LIBRARIES) is None:
            return ("the HIP runtime libamdhip64.so (ROCm) is not found (set XLA_VMM_HIP_LIBRARY to "
                    "its path if it is installed elsewhere)")
        return None
    if backend == "cuda":
        if _loads(CUDA_LIBRARIES) is None:
            return "the NVIDIA driver library libcuda.so.1 is not found (no NVIDIA driver on this machine)"
        if device_nodes and not any(os.path.exists(d) for d in NVIDIA_DEVICES):
            return "no NVIDIA GPU device (%s)" % ", ".join(NVIDIA_DEVICES)
        if device_nodes and os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
            return "CUDA_VISIBLE_DEVICES=%r hides every GPU" % os.environ["CUDA_VISIBLE_DEVICES"]
        return None
    return f"backend {backend!r} is not one of cuda, hip, host (XLA_VMM_BACKEND or the backend option)"


def installed_jax_versions():
    """{"jax": version, "jaxlib": version} of the jax this process imported (jaxlib left out when
    it has no version module)."""
    import importlib

    versions = {"jax": importlib.import_module("jax.version").__version__}
    try:
        versions["jaxlib"] = importlib.import_module("jaxlib.version").__version__
    except (ImportError, AttributeError):
        pass
    return versions


def _release(version):
    """(major, minor, patch) of a version string ("0.11.2.dev20260101" -> (0, 11, 2))."""
    import re

    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    return tuple(int(x or 0) for x in m.groups()) if m else None


def version_problem(versions=None):
    """Why the installed jax / jaxlib are not the ones this plugin is built for (with the pip
    command that fixes it), or None."""
    versions = installed_jax_versions() if versions is None else versions
    want = _release(JAX_VERSION)
    wrong = {name: v for name, v in versions.items() if _release(v) != want}
    if not wrong:
        return None
    have = ", ".join(f"{name} {v}" for name, v in versions.items())
    fix = f'pip install "jax[cuda13]=={JAX_VERSION}"' if gpu_platform() == "cuda" else \
        f'pip install "jax=={JAX_VERSION}" with the ROCm plugin of jax {JAX_VERSION}'
    return (f"the plugin is built for jax {JAX_VERSION} (jaxlib {JAX_VERSION}) and this python has "
            f"{have}; install the supported one: {fix}")


def jax_platforms():
    """The platforms named by jax.config.jax_platforms and the JAX_PLATFORMS environment variable."""
    value = os.environ.get("JAX_PLATFORMS", "")
    try:
        from jax._src import config

        value += "," + (config.jax_platforms.value or "")
    except (ImportError, AttributeError):
        pass
    return [p.strip().lower() for p in value.split(",") if p.strip()]


def initialize():
    """Register the plugin with JAX (idempotent); see the module's doc for when it does not."""
    global _registered
    if _registered:
        return
    path = library_path()
    if path is None:
        logger.warning(
            "xla-vmm: no plugin library (set XLA_VMM_LIBRARY or install a wheel "
            "that bundles %s); the 'vmm' backend is not registered",
            LIBRARY_NAME,
        )
        return
    from jax._src import xla_bridge

    _registered = True
    named = PLUGIN_NAME in jax_platforms()
    if not named:
        # JAX creates every registered plugin's client: one that cannot start would break JAX.
        problem = backend_problem()
        if problem:
            logger.info("xla-vmm: the 'vmm' backend is not registered: %s. On a GPU machine select it "
                        "with JAX_PLATFORMS=vmm; without a GPU: %s JAX_PLATFORMS=vmm",
                        problem, HOST_SETTING)
            return
        problem = version_problem()
        if problem:
            logger.warning("xla-vmm: the 'vmm' backend is not registered: %s", problem)
            return
    else:
        problem = version_problem()
        if problem:
            # The library is not loaded into another jaxlib; JAX_PLATFORMS names vmm, so JAX raises
            # this message when it creates the backend (the first jax call).
            def refuse():
                raise RuntimeError(f"xla-vmm: {problem}")

            xla_bridge.register_backend_factory(PLUGIN_NAME, refuse, priority=300,
                                                fail_quietly=False, experimental=False)
            return
    # options: called when the client is created; JAX then applies
    # jax_pjrt_client_create_options on top (a user's vendor_plugin_path wins).
    # A low priority: installing the package does not change the default
    # backend; JAX_PLATFORMS=vmm (or jax.devices("vmm")) selects it.
    xla_bridge.register_plugin(
        PLUGIN_NAME, priority=300, library_path=path, options=_client_options
    )
    target = os.environ.get("XLA_VMM_REPORT", "").strip()
    if target:
        # Registered after JAX's own exit handler (jax.api's clean_up, at `import jax`), which clears
        # the backends and their programs: exit handlers run last in, first out, so this one sees them.
        atexit.register(write_report, target, path)
    platform = gpu_platform()
    if os.environ.get("XLA_VMM_GPU_ALIAS", "1").strip() != "0" and _vmm_replaces_gpu():
        _alias_as_gpu(xla_bridge, platform)


def _vmm_replaces_gpu():
    """Did the user choose vmm over the stock GPU backend (JAX_PLATFORMS lists vmm, not cuda/rocm/gpu)?"""
    from jax._src import config

    chosen = [p.strip() for p in (config.jax_platforms.value or "").split(",") if p.strip()]
    return PLUGIN_NAME in chosen and not {"cuda", "rocm", "gpu"} & set(chosen)


def _alias_as_gpu(xla_bridge, platform):
    """With ``JAX_PLATFORMS=vmm`` (or ``vmm,cpu``), the vmm client also answers as JAX's ``cuda``
    backend (``rocm`` on ROCm, the same way; "cuda" below): ``jax.devices("gpu")``, ``jit(backend="gpu")``, ``default_device("gpu")`` and the
    lowering of GPU-only primitives (host callbacks, custom calls) find it. JAX keys its GPU lowering
    rules and backend checks by "cuda" (the client's platform, "gpu" in jaxlib, canonicalizes to
    it), so a backend named only "vmm" is not JAX's GPU.

    How: "vmm" in JAX_PLATFORMS expands to "vmm", "cuda" (JAX's alias table), and when the vmm
    client is created (``_client_options``, after every plugin registered) the "cuda" entry of
    JAX's backend factories is replaced by one returning that same client. The stock CUDA client
    is never created. The tables are JAX's private ones: if a JAX release renames them the alias
    is skipped with a warning and "gpu" stays unknown. XLA_VMM_GPU_ALIAS=0 turns it off.
    """
    aliases = getattr(xla_bridge, "_alias_to_platforms", None)
    if not isinstance(aliases, dict) or not hasattr(xla_bridge, "_backend_factories"):
        logger.warning("xla-vmm: this JAX has no platform alias table; 'gpu' does not name vmm")
        return
    aliases[PLUGIN_NAME] = [PLUGIN_NAME, platform]
    global _alias_platform
    _alias_platform = platform


def write_report(target, library=None):
    """Write :func:`report` to `target` (see ``XLA_VMM_REPORT`` in the module's doc); a failure is
    logged, never raised (it runs at exit)."""
    try:
        r = report(library)
        if target in ("-", "stderr"):
            print(str(r), file=sys.stderr)
            return
        path = target.replace("%p", str(os.getpid()))
        with open(path, "w") as fh:
            if path.endswith(".json"):
                json.dump(dict(r), fh, indent=1)
            else:
                fh.write(str(r) + "\n")
    except Exception as e:  # noqa: BLE001  (at exit: say it, do not raise)
        logger.warning("xla-vmm: XLA_VMM_REPORT=%s: the report could not be written: %s", target, e)


# The JAX GPU platform the vmm client also answers as ("cuda" / "rocm"), once aliased.
_alias_platform = None


def _install_gpu_alias(platform):
    """Point JAX's backend factory of `platform` at the vmm client (see _alias_as_gpu)."""
    import dataclasses

    from jax._src import xla_bridge

    def same_client():
        return xla_bridge._backends[PLUGIN_NAME]

    old = xla_bridge._backend_factories.get(platform)
    if old is not None:
        new = dataclasses.replace(old, factory=same_client, experimental=False)
    else:
        new = xla_bridge.BackendRegistration(same_client, 300, False, False, None)
    xla_bridge._backend_factories[platform] = new


from ._stats import report, stats, trim  # noqa: E402,F401  (jax_plugins.xla_vmm.report(), .stats(), .trim())
