"""The Python package finds the vendor XLA GPU plugin of its interpreter (importlib) and passes
it as the `vendor_plugin_path` client option; XLA_VMM_VENDOR_PLUGIN wins (the plugin reads it).
Runs in a subprocess with a fake `jax_plugins.xla_cuda13` package first on the path."""
import json
import os
import subprocess
import sys
import textwrap

INTEGRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

SCRIPT = textwrap.dedent("""
    import json
    from jax_plugins import xla_vmm
    print(json.dumps({"path": xla_vmm.vendor_plugin_path(), "options": xla_vmm._client_options()}))
""")


def discover(tmp_path, env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_VMM_VENDOR_PLUGIN", "XLA_VMM_BACKEND")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), INTEGRATION, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_vendor_plugin_found_through_importlib(tmp_path):
    pkg = tmp_path / "jax_plugins" / "xla_cuda13"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "xla_cuda_plugin.so").write_bytes(b"")
    want = str(pkg / "xla_cuda_plugin.so")
    got = discover(tmp_path, {})
    assert os.path.realpath(got["path"]) == os.path.realpath(want), got
    assert os.path.realpath(got["options"]["vendor_plugin_path"]) == os.path.realpath(want), got
    # The environment variable wins: the package then passes nothing.
    assert discover(tmp_path, {"XLA_VMM_VENDOR_PLUGIN": "/x/y.so"})["options"] == {}
    # No compiler for the host backend.
    assert discover(tmp_path, {"XLA_VMM_BACKEND": "host"})["options"] == {}
