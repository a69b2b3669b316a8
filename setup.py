"""Package discovery for the wheel (issue 36 item 1); everything else is in pyproject.toml.

pyproject's own `packages.find` names packages by their folder, which would ship the reference
methods as a top-level `methods`; here each folder is discovered under its import name instead.
"""
from setuptools import find_packages, setup

# import name -> folder, as in pyproject's package-dir
ROOTS = {"clharness": "clharness", "clharness_methods": "methods", "clharness_suites": "suites"}


def discovered_packages():
    packages = []
    for name, folder in ROOTS.items():
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(folder)]
    return packages


setup(packages=discovered_packages())
