"""The one compiled part of kvproto-cpu: ``kvproto_cpu._streamcopy`` (CPU-13), built for the stable ABI.

It is optional: where it cannot be built (no C compiler, no Python headers), the wheel still installs
and the data plane copies with ``numpy.copyto`` (``CpuTransferHandler.copy_kernel == "numpy"``). A
free-threaded CPython has no stable ABI to build for; the extension is left out there.
"""

import sysconfig

from setuptools import Extension, setup

if sysconfig.get_config_var("Py_GIL_DISABLED"):
    setup()
else:
    setup(
        ext_modules=[
            Extension(
                "kvproto_cpu._streamcopy",
                sources=["src/kvproto_cpu/_streamcopy.c"],
                define_macros=[("Py_LIMITED_API", "0x030B0000")],
                py_limited_api=True,
                optional=True,
            )
        ],
        options={"bdist_wheel": {"py_limited_api": "cp311"}},
    )
