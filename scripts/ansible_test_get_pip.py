"""A get-pip bootstrap for ansible-test on a machine without ci-files.testing.ansible.com.

ansible-test creates its sanity venvs without pip and runs a bootstrap script as a
module, with pip's arguments on argv (`--disable-pip-version-check pip==24.2
[--no-setuptools] [--no-wheel]`), from ~/.ansible/test/cache/get_pip_<version>.py
(ansible_test/_util/target/setup/requirements.py, quiet_pip.py). The upstream get-pip.py
carries pip as an embedded zip and runs `pip install` with those arguments, adding
setuptools and wheel unless told not to. This one does the same with the pip wheel
Debian ships (python3-pip-whl, /usr/share/python-wheels), so the pinned pip comes
from the package index like every other requirement.

`make collection-sanity` copies it into ansible-test's cache under the name it looks for.
"""

import glob
import sys


def main():
    wheels = sorted(glob.glob("/usr/share/python-wheels/pip-*.whl"))
    if not wheels:
        sys.exit("no pip wheel in /usr/share/python-wheels: apt-get install python3-pip-whl")
    sys.path.insert(0, wheels[-1])
    from pip._internal.cli.main import main as pip_main  # noqa: E402 - from the wheel just put on the path

    args = sys.argv[1:]
    packages = [a for a in args if not a.startswith("-")]
    options = [a for a in args if a.startswith("-") and a not in ("--no-setuptools", "--no-wheel")]
    if "--no-setuptools" not in args and not any(p.startswith("setuptools") for p in packages):
        packages.append("setuptools")
    if "--no-wheel" not in args and not any(p.startswith("wheel") for p in packages):
        packages.append("wheel")
    sys.exit(pip_main(["install", "--upgrade", "--force-reinstall"] + options + packages))


if __name__ == "__main__":
    main()
