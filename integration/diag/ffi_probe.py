"""What XLA FFI ABI the GPU machine's jaxlib and vendor plugin speak (a diagnostic, not a test; issue 12).

Running XLA FFI custom calls (JAX's host callbacks, cuSOLVER, ...) on our runtime means handing their
handlers a call frame and an `XLA_FFI_Api` table laid out as the handlers were compiled. That version is
not in any header available here, so this asks the machine:

  1. whether the vendor plugin exports `XLA_FFI_GetApi` (and, if so, the version its table reports);
  2. the API version jaxlib's own GPU handlers were built for: each handler is called, in a child
     process, with a metadata-request call frame (`XLA_FFI_Metadata_Extension`), which a handler answers
     with its API version and traits without touching a device, or with an error naming the version it
     wants when ours (0.0, on purpose) does not match. The frame is laid out as XLA's c_api.h at API
     0.1; a handler built for another layout may fail or die: the child's exit is reported as it is.

Usage (GPU machine): python3 integration/diag/ffi_probe.py [--out FILE.json]
"""
import argparse
import ctypes as C
import json
import os
import subprocess
import sys


class ExtBase(C.Structure):
    pass


ExtBase._fields_ = [("struct_size", C.c_size_t), ("type", C.c_int), ("next", C.POINTER(ExtBase))]


class ApiVersion(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p),
                ("major_version", C.c_int), ("minor_version", C.c_int)]


class Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("api_version", ApiVersion), ("traits", C.c_uint32)]


class MetadataExt(C.Structure):
    _fields_ = [("extension_base", ExtBase), ("metadata", C.POINTER(Metadata))]


class Args(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("size", C.c_int64),
                ("types", C.c_void_p), ("args", C.c_void_p)]


class Attrs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("size", C.c_int64),
                ("types", C.c_void_p), ("names", C.c_void_p), ("attrs", C.c_void_p)]


class ErrorCreateArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("message", C.c_char_p),
                ("errc", C.c_int)]


ERROR_CREATE = C.CFUNCTYPE(C.c_void_p, C.POINTER(ErrorCreateArgs))


class Api(C.Structure):
    # XLA_FFI_Api at 0.1: header, version, internal api, then the functions (Error_Create first); room
    # for 24 more pointers, all null.
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("api_version", ApiVersion),
                ("internal_api", C.c_void_p), ("error_create", ERROR_CREATE),
                ("rest", C.c_void_p * 24)]


class CallFrame(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.POINTER(ExtBase)),
                ("api", C.POINTER(Api)), ("ctx", C.c_void_p), ("stage", C.c_int), ("args", Args),
                ("rets", Args), ("attrs", Attrs), ("future", C.c_void_p)]


def capsule_pointer(cap):
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    name = C.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = C.c_char_p, [C.py_object]
    return get(cap, name(cap))


def gpu_handlers():
    """{target: {stage: capsule}} from jaxlib's CUDA plugin extension."""
    import importlib
    for mod in ("jax_cuda13_plugin.cuda_plugin_extension", "jax_cuda12_plugin.cuda_plugin_extension"):
        try:
            ext = importlib.import_module(mod)
        except ImportError:
            continue
        out = {}
        for name, h in ext.ffi_handlers().items():
            out[name] = dict(h) if isinstance(h, dict) else {"execute": h}
        return mod, out
    return None, {}


def probe_one(target, stage):
    """In this (child) process: call one handler with a metadata request; print a JSON line."""
    _, handlers = gpu_handlers()
    fn = C.CFUNCTYPE(C.c_void_p, C.POINTER(CallFrame))(capsule_pointer(handlers[target][stage]))
    messages = []

    @ERROR_CREATE
    def error_create(a):
        messages.append((a.contents.errc, (a.contents.message or b"").decode(errors="replace")))
        return 1  # a non-null error; never dereferenced by the handler

    api = Api(struct_size=C.sizeof(Api), api_version=ApiVersion(C.sizeof(ApiVersion), None, 0, 0),
              error_create=error_create)
    md = Metadata(struct_size=C.sizeof(Metadata), api_version=ApiVersion(C.sizeof(ApiVersion), None, -1, -1))
    ext = MetadataExt(ExtBase(C.sizeof(MetadataExt), 1, None), C.pointer(md))
    # XLA_FFI_CallFrame_STRUCT_SIZE runs to `attrs` (the `future` out field is not counted).
    frame = CallFrame(struct_size=CallFrame.attrs.offset + C.sizeof(Attrs), extension_start=C.cast(C.pointer(ext), C.POINTER(ExtBase)),
                      api=C.pointer(api), stage=3)
    for f in ("args", "rets"):
        getattr(frame, f).struct_size = C.sizeof(Args)
    frame.attrs.struct_size = C.sizeof(Attrs)
    err = fn(C.byref(frame))
    print(json.dumps({"target": target, "stage": stage, "returned_error": bool(err), "errors": messages,
                      "metadata_api_version": [md.api_version.major_version, md.api_version.minor_version],
                      "metadata_traits": md.traits}))


def vendor_api():
    """Does the vendor plugin export XLA_FFI_GetApi, and what version does its table report?"""
    try:
        import jax_plugins.xla_cuda13 as v
        path = os.path.join(os.path.dirname(v.__file__), "xla_cuda_plugin.so")
    except ImportError:
        return {"vendor": None}
    lib = C.CDLL(path)
    out = {"vendor": path, "exports": {s: hasattr(lib, s) for s in ("XLA_FFI_GetApi", "GetPjrtApi")}}
    if out["exports"]["XLA_FFI_GetApi"]:
        lib.XLA_FFI_GetApi.restype = C.c_void_p
        p = lib.XLA_FFI_GetApi()
        head = C.cast(p, C.POINTER(C.c_size_t * 2))[0]
        ver = ApiVersion.from_address(p + 2 * C.sizeof(C.c_size_t))
        out["api"] = {"struct_size": head[0], "version": [ver.major_version, ver.minor_version]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        probe_one(*a.child)
        return
    result = {"vendor": vendor_api()}
    mod, handlers = gpu_handlers()
    result["module"], result["handlers"] = mod, []
    for target, stages in sorted(handlers.items()):
        for stage in sorted(stages):
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", target, stage],
                               capture_output=True, text=True, timeout=120)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"target": target, "stage": stage}
            row["rc"] = p.returncode
            if p.returncode != 0:
                row["stderr_tail"] = p.stderr.strip().splitlines()[-3:]
            result["handlers"].append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(result["vendor"]))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
