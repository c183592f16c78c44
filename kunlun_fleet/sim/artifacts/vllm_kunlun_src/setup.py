"""vLLM-Kunlun: the Kunlunxin XPU platform plugin for vLLM.

    python setup.py build      # compiles the native extension vllm_kunlun._kunlun
    python setup.py install    # installs vllm_kunlun into the interpreter's site-packages
"""
import os

from setuptools import Extension, find_packages, setup
from setuptools.command.install import install as _install

ROOT = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.15.1.dev0"
COMMIT = "4885de2"


class install(_install):
    """Plain (non-egg) install: the package lands directly in site-packages."""

    def initialize_options(self):
        super().initialize_options()
        self.old_and_unmanageable = True


def read_requirements():
    with open(os.path.join(ROOT, "requirements.txt")) as fh:
        return [line.strip() for line in fh if line.strip() and not line.startswith("#")]


setup(
    name="vllm-kunlun",
    version=VERSION,
    description="vLLM Kunlun backend plugin (commit %s)" % COMMIT,
    packages=find_packages(include=["vllm_kunlun", "vllm_kunlun.*"]),
    package_data={"vllm_kunlun": ["patches/*.py", "quantization/*.py"]},
    ext_modules=[
        Extension(
            "vllm_kunlun._kunlun",
            sources=["csrc/kunlun_ops.c"],
            define_macros=[("VLLM_KUNLUN_VERSION", '"%s"' % VERSION),
                           ("VLLM_KUNLUN_COMMIT", '"%s"' % COMMIT)],
            extra_compile_args=["-O2"],
        )
    ],
    install_requires=read_requirements(),
    python_requires=">=3.10",
    entry_points={"vllm.platform_plugins": ["kunlun = vllm_kunlun:register"],
                  "vllm.general_plugins": ["kunlun_ops = vllm_kunlun:register_model"]},
    cmdclass={"install": install},
    zip_safe=False,
)
