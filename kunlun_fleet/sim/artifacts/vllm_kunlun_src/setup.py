"""vLLM-Kunlun: the Kunlunxin XPU platform plugin for vLLM (stand-in of the 0.15.1-era tree).

    python setup.py build      # compiles the native extension vllm_kunlun._kunlun
    python setup.py install    # installs vllm_kunlun into the interpreter's site-packages

Its metadata is declared as in the public tree at 8986d8c: the name vllm_kunlun and
0.15.1 below, vllm-kunlun 0.15.1.dev0 in pyproject.toml. With a [project] table there,
setuptools takes pyproject.toml's name, version and entry points over setup()'s (and warns
that these are ignored). Nothing in the tree names its commit: only git archive records it.
"""

import os

from setuptools import Extension, find_packages, setup
from setuptools.command.install import install as _install

ROOT = os.path.dirname(os.path.abspath(__file__))


class install(_install):
    """Plain (non-egg) install: the package lands directly in site-packages."""

    def initialize_options(self):
        super().initialize_options()
        self.old_and_unmanageable = True


if __name__ == "__main__":
    setup(
        name="vllm_kunlun",
        version="0.15.1",
        author="vLLM-Kunlun team",
        license="Apache 2.0",
        description="vLLM Kunlun3 backend plugin",
        packages=find_packages(include=["vllm_kunlun", "vllm_kunlun.*"]),
        package_data={"vllm_kunlun": ["patches/*.py"]},
        python_requires=">=3.10",
        ext_modules=[
            Extension(
                "vllm_kunlun._kunlun",
                sources=["csrc/kunlun_ops.c"],
                # Stand-in only: what _kunlun.version() answers (tests tell the commits apart).
                define_macros=[("VLLM_KUNLUN_VERSION", '"0.15.1.dev0"'), ("VLLM_KUNLUN_COMMIT", '"4885de2"')],
                extra_compile_args=["-O2"],
            )
        ],
        entry_points={
            "vllm.platform_plugins": ["kunlun = vllm_kunlun:register"],
            "vllm.general_plugins": [
                "kunlun_model = vllm_kunlun:register_model",
                "kunlun_quant = vllm_kunlun:register_quant_method",
            ],
        },
        cmdclass={"install": install},
        zip_safe=False,
    )
