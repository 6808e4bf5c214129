// The probe's store kernel on HIP (probe.rs: STORE_KERNEL_HIP), the twin of its PTX: one thread writes
// `value` to `p`. clang builtins only, no HIP header (hiprtc compiles it for the device at first use).
extern "C" __attribute__((global)) void xla_vmm_probe_store(unsigned* p, unsigned value) { *p = value; }
