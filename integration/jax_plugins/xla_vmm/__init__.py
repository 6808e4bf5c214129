"""xla-vmm as a JAX PJRT plugin, registered under the name ``vmm``.

JAX finds this module through the ``jax_plugins`` entry point (or the
``jax_plugins`` namespace package) and calls :func:`initialize`. Then::

    JAX_PLATFORMS=vmm python your_script.py

Client options come from ``jax.config.jax_pjrt_client_create_options``
(``"strict:true;xla_vmm_tmp_copy_threshold:0"``) or the environment
(``XLA_VMM_STRICT``, ``XLA_VMM_TMP_COPY_THRESHOLD``, ``XLA_VMM_BACKEND``,
``XLA_VMM_VENDOR_PLUGIN``). The shared library is the one bundled in this
package directory, or ``XLA_VMM_LIBRARY`` when set.
"""

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

PLUGIN_NAME = "vmm"
LIBRARY_NAME = "xla_vmm_plugin.so"
_registered = False


def library_path():
    """Path of the plugin shared library, or None when there is none."""
    env = os.environ.get("XLA_VMM_LIBRARY")
    if env:
        return env if os.path.isfile(env) else None
    bundled = Path(__file__).resolve().parent / LIBRARY_NAME
    return str(bundled) if bundled.is_file() else None


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

    # options=None: JAX builds the options from jax_pjrt_client_create_options.
    # A low priority: installing the package does not change the default
    # backend; JAX_PLATFORMS=vmm (or jax.devices("vmm")) selects it.
    xla_bridge.register_plugin(PLUGIN_NAME, priority=300, library_path=path, options=None)
    _registered = True
