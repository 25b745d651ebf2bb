"""Build the optional compiled core (``mrkit/_engine/_hotc.pyx``, Cython).

Where Cython or a C++ compiler is missing, or ``MRKIT_NO_EXTENSIONS=1`` is set, mrkit installs as pure
Python and runs the same semantics from ``mrkit/_engine/_hot.py``; ``mrkit info`` says which core runs.
Everything else is in ``pyproject.toml``."""
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

SKIP = os.environ.get("MRKIT_NO_EXTENSIONS", "").strip() not in ("", "0")


class OptionalBuildExt(build_ext):
    """``build_ext`` that falls back to pure Python instead of failing the install."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers
            self._skip(exc)

    def build_extensions(self):
        # C++17 (the free list's containers, mrkit/_engine/_freetree.h)
        flag = "/std:c++17" if self.compiler.compiler_type == "msvc" else "-std=c++17"
        for ext in self.extensions:
            ext.extra_compile_args = [*ext.extra_compile_args, flag]
        super().build_extensions()

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    def _skip(self, exc):
        print(f"mrkit: the compiled core was not built ({exc}); installing the pure-Python core",
              file=sys.stderr)


def extensions():
    if SKIP:
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("mrkit: Cython is not available; installing the pure-Python core", file=sys.stderr)
        return []
    return cythonize(["mrkit/_engine/_hotc.pyx"], compiler_directives={"language_level": 3},
                     quiet=True)


if os.environ.get("MRKIT_BUILD_INPLACE", "").strip() not in ("", "0"):
    # The extension alone, built in place, without the project's metadata: a setuptools older than 77
    # rejects pyproject.toml's SPDX license string, and a machine without network cannot fetch a newer
    # one (the GPU tools build this way: MRKIT_BUILD_INPLACE=1 python3 setup.py).
    from setuptools import Distribution
    dist = Distribution({"ext_modules": extensions(), "cmdclass": {"build_ext": OptionalBuildExt},
                         "script_args": ["build_ext", "--inplace"]})
    dist.parse_command_line()
    dist.run_commands()
else:
    setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
