"""Marks the wheel as platform specific but Python-version independent: it bundles a native library
(the PJRT plugin, loaded by jaxlib with dlopen, not a CPython extension), so one wheel serves every
Python 3: tag py3-none-<platform>. Which Python 3 is pyproject.toml's requires-python (the one jax
0.11.2 supports, 3.12+): pip refuses the wheel on an older one."""
from setuptools import setup
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools
    from wheel.bdist_wheel import bdist_wheel


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": PlatformWheel})
