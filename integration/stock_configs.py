"""The stock XLA configurations every benchmark measures, so that "best stock" means the same everywhere.

The XLA inside jax 0.11.2 has its own command-buffer VA remapping: `--xla_gpu_command_buffer_update_mode`
SKIP_TEMP or SKIP_PROFILED (which switch its allocator to VMM); ALWAYS_UPDATE is the default. The best
stock configuration of a row is the fastest of command buffers on (the default), off, and those two modes,
measured in the same run.

    python3 integration/stock_configs.py NAME   prints the XLA flags of configuration NAME (for shell scripts)
"""
import sys

# (name, extra XLA flags, short key used by shell scripts)
STOCK_CONFIGS = [
    ("stock cmdbuf on", "", "cuda"),
    ("stock cmdbuf off", "--xla_gpu_enable_command_buffer=", "cuda_nocb"),
    ("stock SKIP_TEMP", "--xla_gpu_command_buffer_update_mode=SKIP_TEMP", "cuda_skip_temp"),
    ("stock SKIP_PROFILED", "--xla_gpu_command_buffer_update_mode=SKIP_PROFILED", "cuda_skip_profiled"),
]


def flags_for(key):
    """Extra XLA flags of the configuration whose name or key is `key`."""
    for name, flags, short in STOCK_CONFIGS:
        if key in (name, short):
            return flags
    raise KeyError("unknown stock configuration %r (known: %s)" % (key, ", ".join(s for _, _, s in STOCK_CONFIGS)))


def with_flags(base, extra):
    """`base` XLA_FLAGS with `extra` appended."""
    return (base + " " + extra).strip()


if __name__ == "__main__":
    try:
        print(flags_for(sys.argv[1]))
    except (IndexError, KeyError) as e:
        sys.exit(str(e))
