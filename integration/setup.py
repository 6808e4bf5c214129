"""Marks the wheel as platform specific: it bundles a native library (the PJRT plugin)."""
from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution)
