"""The `xla-vmm` console script: runs the CLI binary bundled in this package (or `XLA_VMM_CLI`)."""
import os
import sys
from pathlib import Path


def binary():
    """Path of the `xla-vmm` binary: `XLA_VMM_CLI`, else the one bundled in this package."""
    env = os.environ.get("XLA_VMM_CLI")
    if env:
        return env
    return str(Path(__file__).resolve().parent / "bin" / "xla-vmm")


def main():
    exe = binary()
    if not os.path.isfile(exe):
        sys.stderr.write("xla-vmm: no CLI binary at %s (build the wheel with integration/build_wheel.sh, "
                         "or set XLA_VMM_CLI)\n" % exe)
        return 127
    if not os.access(exe, os.X_OK):
        try:
            os.chmod(exe, 0o755)
        except OSError as e:
            sys.stderr.write("xla-vmm: %s is not executable (%s)\n" % (exe, e))
            return 126
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
