"""Host-offloaded compute for xla-vmm's runtime: ``compute_on("device_host")`` programs.

XLA's GPU compiler puts each host computation into the executable as its own HLO module (a
``host_execute_start`` thunk), with XLA:CPU's ahead-of-time compile of it (native code for the
compiling machine: what XLA's own host thunk runs). xla-vmm's runtime stages the computation's
operands in host memory and calls back here. The module is converted to StableHLO (jaxlib's
``hlo_to_stablehlo``) and compiled once with a CPU client of this process's jaxlib; then, when the
executable's native code was compiled for a machine like this one (the same target machine options
as our compile's), that code is loaded in its place through the CPU client's deserialization, so
that the results are the bits stock XLA computes (a fresh compile may order a dot's sums
differently). Results are written back into the runtime's staging memory. See
plugin/src/xla_ffi/host_compute.rs for the C side of the two callbacks.

Arrays cross as XLA's dense row-major bytes; sub-byte types (S4, U4, S2, U2, S1, U1, F4E2M1FN) stay
packed as the device holds them (the first element in the low bits of a byte) and are unpacked for
the CPU client and packed again here.
"""
import ctypes
import logging
import threading

logger = logging.getLogger(__name__)


class HostArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64), ("dtype", ctypes.c_char_p),
                ("dims", ctypes.POINTER(ctypes.c_int64)), ("rank", ctypes.c_uint64)]


LOAD = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                        ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_size_t)
RUN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64, ctypes.POINTER(HostArray), ctypes.c_size_t,
                       ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)


def _dtypes():
    """XLA element type name -> (numpy dtype, bits of one element as the device stores it)."""
    import ml_dtypes
    import numpy as np

    table = {
        "PRED": (np.bool_, 8), "S8": (np.int8, 8), "S16": (np.int16, 16), "S32": (np.int32, 32),
        "S64": (np.int64, 64), "U8": (np.uint8, 8), "U16": (np.uint16, 16), "U32": (np.uint32, 32),
        "U64": (np.uint64, 64), "F16": (np.float16, 16), "F32": (np.float32, 32),
        "F64": (np.float64, 64), "C64": (np.complex64, 64), "C128": (np.complex128, 128),
        "BF16": (ml_dtypes.bfloat16, 16),
    }
    optional = {
        "F8E5M2": ("float8_e5m2", 8), "F8E4M3FN": ("float8_e4m3fn", 8), "F8E4M3": ("float8_e4m3", 8),
        "F8E4M3B11FNUZ": ("float8_e4m3b11fnuz", 8), "F8E5M2FNUZ": ("float8_e5m2fnuz", 8),
        "F8E4M3FNUZ": ("float8_e4m3fnuz", 8), "F8E3M4": ("float8_e3m4", 8),
        "F8E8M0FNU": ("float8_e8m0fnu", 8), "S4": ("int4", 4), "U4": ("uint4", 4), "S2": ("int2", 2),
        "U2": ("uint2", 2), "F4E2M1FN": ("float4_e2m1fn", 4),
    }
    for name, (attr, bits) in optional.items():
        if hasattr(ml_dtypes, attr):
            table[name] = (getattr(ml_dtypes, attr), bits)
    return table


def unpack(raw, count, bits, dtype):
    """`count` elements of `bits` bits each, packed into the uint8 array `raw` (the first in the low
    bits), as an array of `dtype` (one byte each)."""
    import numpy as np

    per = 8 // bits
    shifts = np.arange(per, dtype=np.uint8) * bits
    codes = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count].astype(np.uint8)
    # ml_dtypes' sub-byte types hold their code in the low bits of a byte.
    return codes.view(dtype)


def pack(values, bits):
    """The inverse of `unpack`: the codes of `values` (a sub-byte ml_dtypes array) packed."""
    import numpy as np

    per = 8 // bits
    codes = values.reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    padded = np.zeros(-(-codes.size // per) * per, np.uint8)
    padded[:codes.size] = codes
    shifts = np.arange(per, dtype=np.uint8) * bits
    return np.bitwise_or.reduce(padded.reshape(-1, per) << shifts, axis=1).astype(np.uint8)


def _varint(buf, p):
    """(value, next position) of the protobuf varint at buf[p]."""
    value = shift = 0
    while True:
        if p >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[p]
        value |= (b & 0x7F) << shift
        p += 1
        shift += 7
        if b < 0x80:
            return value, p


def _encode_varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fields(buf):
    """The top-level fields of a serialized protobuf message: [(number, raw bytes of the whole field,
    payload of a length-delimited field or None)]."""
    out, p = [], 0
    while p < len(buf):
        start = p
        key, p = _varint(buf, p)
        number, wire = key >> 3, key & 7
        payload = None
        if wire == 0:
            _, p = _varint(buf, p)
        elif wire == 1:
            p += 8
        elif wire == 5:
            p += 4
        elif wire == 2:
            n, p = _varint(buf, p)
            payload = bytes(buf[p:p + n])
            p += n
        else:
            raise ValueError(f"protobuf wire type {wire}")
        if p > len(buf):
            raise ValueError("truncated field")
        out.append((number, bytes(buf[start:p]), payload))
    return out


def field(buf, number):
    """The payload of length-delimited field `number` of a message (the last one), or None."""
    found = [payload for n, _, payload in fields(buf) if n == number]
    return found[-1] if found else None


def with_native_code(serialized, aot):
    """A CPU client's serialized executable (an IFRT header, then xla::ExecutableAndOptionsProto,
    whose field 1 is the XLA:CPU CompilationResultProto) with `aot` (another CompilationResultProto
    of the same module) in place of its compile result; None when `aot` was compiled for other
    target machine options (CompilationResultProto field 9) than this machine's compile."""
    n, p = _varint(serialized, 0)
    header, body = serialized[:p + n], serialized[p + n:]
    parts = fields(body)
    ours = [payload for number, _, payload in parts if number == 1]
    if len(ours) != 1 or field(ours[0], 9) is None or field(ours[0], 9) != field(aot, 9):
        return None
    rebuilt = b"".join(b"\x0a" + _encode_varint(len(aot)) + aot if number == 1 else raw
                       for number, raw, _ in parts)
    return header + rebuilt


def _fail(err, cap, message):
    data = message.encode(errors="replace")[: max(cap - 1, 0)]
    if cap:
        ctypes.memmove(err, data + b"\0", len(data) + 1)
    return 1


class HostCompute:
    """The CPU compiler and runner behind the two callbacks (one per process)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._client = None
        self._by_module = {}  # module bytes -> handle
        self._programs = []  # handle -> (loaded executable, device)
        self.origins = []  # handle -> where its code came from
        self._plans = {}  # handle -> (signature, operand plan, result plan): see _plan
        self._views = {}  # handle -> (leaf addresses, views of them): see _run
        self._types = None
        # The C function pointers must outlive every call: kept here.
        self.load_fn = LOAD(self._load)
        self.run_fn = RUN(self._run)

    def _cpu(self):
        if self._client is None:
            from jax._src import xla_bridge

            self._client = xla_bridge.make_cpu_client()
            self._types = _dtypes()
        return self._client

    def compile(self, module, aot=None):
        """A handle for the serialized HloModuleProto `module`, ready to run on the CPU (once per
        module): XLA:CPU's compile of it `aot` (a CompilationResultProto) where that suits this
        machine, else our compile."""
        from jax._src.lib import _jax, xla_client

        key = (module, aot)
        with self._lock:
            if key in self._by_module:
                return self._by_module[key]
            client = self._cpu()
            stablehlo = _jax.mlir.hlo_to_stablehlo(module)
            device = client.devices()[0]
            exe = client.compile_and_load(stablehlo, [device], xla_client.CompileOptions())
            native = "compiled here"
            if aot:
                try:
                    blob = with_native_code(exe.serialize(), aot)
                    if blob is None:
                        native = "compiled here (the executable's code is for another machine)"
                    else:
                        exe = client.deserialize_executable(blob, [device], None)
                        native = "the executable's own XLA:CPU code"
                except Exception as e:  # noqa: BLE001  (our compile stays)
                    native = f"compiled here (loading the executable's code: {type(e).__name__}: {e})"
            self._programs.append((exe, device))
            handle = len(self._programs) - 1
            self._by_module[key] = handle
            self.origins.append(native)
            logger.debug("xla-vmm: host computation %d (%d bytes of HLO): %s", handle, len(module), native)
            return handle

    def run(self, handle, args, results):
        """Run program `handle`: args and results are (memoryview of the bytes, dtype name, dims)."""
        if not 0 <= handle < len(self._programs):
            raise ValueError(f"no host computation {handle} was compiled")
        exe, device = self._programs[handle]
        import numpy as np
        from jax._src.lib import _jax

        signature = tuple((name, dims) for _, name, dims in args + results)
        plan = self._plans.get(handle)
        if plan is None or plan[0] != signature:
            plan = self._plan(device, args, results, signature)
            self._plans[handle] = plan
        _, ins, outs = plan
        inputs = []
        for (data, _, _), (dtype, bits, count, dims, aval, sharding) in zip(args, ins):
            raw = np.frombuffer(data, np.uint8)
            host = (unpack(raw, count, bits, dtype) if bits < 8 else raw.view(dtype)).reshape(dims)
            # A copy during the call: the staging memory is the runtime's again after it.
            inputs.append(_jax.batched_device_put(aval, sharding, [host], [device], True, False,
                                                  _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL))
        produced = exe.execute_sharded(inputs).disassemble_into_single_device_arrays()
        del inputs
        if len(produced) != len(results):
            raise ValueError(f"the host computation returned {len(produced)} arrays, the thunk has "
                             f"{len(results)} results")
        for i, ((data, _, dims), out, (dtype, bits)) in enumerate(zip(results, produced, outs)):
            value = np.asarray(out[0])
            if value.dtype != dtype or value.shape != dims:
                raise ValueError(f"result {i}: the host computation gave {value.dtype}{list(value.shape)}, "
                                 f"the thunk wants {dtype}{list(dims)}")
            raw = pack(value, bits) if bits < 8 else value.reshape(-1).view(np.uint8)
            if raw.nbytes != len(data):
                raise ValueError(f"result {i}: {raw.nbytes} bytes for a {len(data)}-byte slice")
            np.frombuffer(data, np.uint8)[:] = raw

    def _plan(self, device, args, results, signature):
        """What each call of a program with these leaves needs, worked out once: per operand
        (NumPy dtype, bits per element, element count, dims, abstract value, sharding), per result
        (NumPy dtype, bits per element)."""
        import numpy as np
        from jax._src import core
        from jax.sharding import SingleDeviceSharding

        sharding = SingleDeviceSharding(device)
        ins = []
        for _, name, dims in args:
            dtype, bits = self._type(name)
            ins.append((dtype, bits, int(np.prod(dims, dtype=np.int64)), dims,
                        core.ShapedArray(dims, dtype), sharding))
        outs = []
        for _, name, _ in results:
            dtype, bits = self._type(name)
            outs.append((np.dtype(dtype), bits))
        return signature, ins, outs

    def _type(self, name):
        found = self._types.get(name)
        if found is None:
            raise ValueError(f"element type {name} has no NumPy type here")
        return found

    # ---- the C callbacks: never raise into ctypes ---------------------------------------------

    def _load(self, module, length, aot, aot_length, handle, err, cap):
        try:
            native = ctypes.string_at(aot, aot_length) if aot and aot_length else None
            handle[0] = self.compile(ctypes.string_at(module, length), native)
            return 0
        except BaseException as e:  # noqa: BLE001
            return _fail(err, cap, f"{type(e).__name__}: {e}")

    def _run(self, handle, arrays, n_args, n_results, err, cap):
        try:
            structs = [arrays[i] for i in range(n_args + n_results)]
            # The runtime stages a program's leaves at the same places run after run: the views of
            # the last run at the same addresses are reused (a handle's leaves always have the same
            # types and dims: they are its module's).
            key = (n_args, tuple((a.data, a.bytes) for a in structs))
            cached = self._views.get(handle)
            if cached is not None and cached[0] == key:
                views = cached[1]
            else:
                views = []
                for a in structs:
                    dims = tuple(a.dims[j] for j in range(a.rank))
                    buf = (ctypes.c_uint8 * a.bytes).from_address(a.data) if a.bytes else bytearray()
                    views.append((memoryview(buf).cast("B"), a.dtype.decode(), dims))
                self._views[handle] = (key, views)
            self.run(handle, views[:n_args], views[n_args:])
            return 0
        except BaseException as e:  # noqa: BLE001
            return _fail(err, cap, f"{type(e).__name__}: {e}")


_instance = None


def register(ffi):
    """Give the plugin our CPU compiler through `ffi` (the package's `_Ffi`: the plugin library and its
    error check); True when it took it."""
    global _instance
    fn = getattr(getattr(ffi, "lib", None), "xla_vmm_host_compute_register", None)
    if fn is None:
        return False
    if _instance is None:
        _instance = HostCompute()
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    err = fn(ctypes.cast(_instance.load_fn, ctypes.c_void_p), ctypes.cast(_instance.run_fn, ctypes.c_void_p))
    return ffi._check(err, "host compute registration")
