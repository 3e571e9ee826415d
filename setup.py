"""One build step pyproject.toml cannot say: the compiled core's type stub
(``cqforensics_core.pyi``, tests/codecs/test_core_stub.py checks it against the module) goes into the
wheel beside the module setuptools-rust builds. Everything else is in pyproject.toml."""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithCoreStub(build_py):
    """build_py, then the core's stub copied to the top of the build (a top-level module's
    stub cannot be package data, and py-modules wants a .py)."""

    def run(self):
        super().run()
        self.copy_file("cqforensics_core.pyi", f"{self.build_lib}/cqforensics_core.pyi")


setup(cmdclass={"build_py": BuildPyWithCoreStub})
