# Lets Beam ship this package to remote workers: --setup_file ./setup.py (Dataflow, Flink, Spark).
# Everything else is in pyproject.toml.
from setuptools import setup

setup()
