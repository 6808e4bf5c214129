"""Binding stats of xla-vmm's VA-stable graph mode, read from the loaded plugin.

``stats()`` returns ``{executable: {...}}`` with, per executable: ``steps``,
``skips``, ``remaps``, ``copies``, ``bytes_copied``, ``unmap_errors``,
``fallbacks``, ``host_binding_ns`` (sum), ``vmm_calls``, ``copy_ops``,
``captures``, ``threshold``, ``threshold_bytes``, ``slots``, ``copy_slots``,
``shadow_bytes``. Counts are per slot per step (summed over steps).
"""
import ctypes
import json


def stats(library=None):
    """Per-executable binding stats of this process (``{}`` before any VA-stable run)."""
    if library is None:
        from . import library_path

        library = library_path()
    if not library:
        raise RuntimeError("xla-vmm: no plugin library (set XLA_VMM_LIBRARY)")
    # The same path jax loaded: dlopen returns that library (its statics).
    lib = ctypes.CDLL(library)
    lib.xla_vmm_stats_json.restype = ctypes.c_void_p
    lib.xla_vmm_stats_json.argtypes = []
    lib.xla_vmm_stats_free.restype = None
    lib.xla_vmm_stats_free.argtypes = [ctypes.c_void_p]
    p = lib.xla_vmm_stats_json()
    try:
        text = ctypes.string_at(p).decode()
    finally:
        lib.xla_vmm_stats_free(p)
    return json.loads(text)
