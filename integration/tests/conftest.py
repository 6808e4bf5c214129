"""JAX under the xla-vmm plugin: `vmm` is the device under test, `cpu` the reference.

Run (GPU machine): XLA_VMM_LIBRARY=/path/libxla_vmm_plugin.so pytest integration/tests
Environment set here before jax is imported:
- JAX_PLATFORMS=vmm,cpu (unless set);
- XLA_VMM_STRICT=1 unless set (every step must run on our runtime; set 0 to allow the fallback).
The plugin is registered through the package in ../jax_plugins (the same code JAX's entry point runs).
"""
import os
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", "vmm,cpu")
os.environ.setdefault("XLA_VMM_STRICT", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

jax = pytest.importorskip("jax")
from jax_plugins import xla_vmm  # noqa: E402

if xla_vmm.library_path() is None:
    pytest.skip("no xla-vmm plugin library (set XLA_VMM_LIBRARY)", allow_module_level=True)
xla_vmm.initialize()
