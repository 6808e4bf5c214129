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
"""

import importlib.util
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

PLUGIN_NAME = "vmm"
LIBRARY_NAME = "xla_vmm_plugin.so"
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


def _client_options():
    """Client options from this package (JAX adds jax_pjrt_client_create_options on top)."""
    if _alias_platform:
        _install_gpu_alias(_alias_platform)
    if os.environ.get("XLA_VMM_VENDOR_PLUGIN"):
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
    path, platform = found
    logger.debug("xla-vmm: vendor plugin %s (%s)", path, platform)
    options = {"vendor_plugin_path": path}
    if platform == "rocm" and not os.environ.get("XLA_VMM_BACKEND"):
        options["backend"] = "hip"  # the HIP backend under the ROCm compiler
    return options


def initialize():
    """Register the plugin with JAX (idempotent)."""
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

    # options: called when the client is created; JAX then applies
    # jax_pjrt_client_create_options on top (a user's vendor_plugin_path wins).
    # A low priority: installing the package does not change the default
    # backend; JAX_PLATFORMS=vmm (or jax.devices("vmm")) selects it.
    xla_bridge.register_plugin(
        PLUGIN_NAME, priority=300, library_path=path, options=_client_options
    )
    platform = gpu_platform()
    if os.environ.get("XLA_VMM_GPU_ALIAS", "1").strip() != "0" and _vmm_replaces_gpu():
        _alias_as_gpu(xla_bridge, platform)
    _registered = True


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


from ._stats import stats  # noqa: E402,F401  (jax_plugins.xla_vmm.stats())
