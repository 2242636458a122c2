"""What users install is what is tested: the package imported here comes from the wheel
installed into a fresh virtualenv (`make test-python`), and carries the repository's Functions
library byte for byte."""

from __future__ import annotations

import os
from importlib import metadata, resources
from pathlib import Path

import pytest

import redis_ratelimit
from conftest import LIBRARY


def test_the_package_is_the_installed_wheel():
    venv = os.environ.get("RATELIMIT_WHEEL_VENV")
    if not venv:
        pytest.skip("run by make test-python, which installs the wheel (RATELIMIT_WHEEL_VENV)")
    assert Path(redis_ratelimit.__file__).resolve().is_relative_to(Path(venv).resolve())
    assert metadata.version("redis-ratelimit-client") == redis_ratelimit.__version__
    requires = metadata.requires("redis-ratelimit-client")
    assert [r for r in requires if "extra" not in r] == ["redis>=5"]
    assert resources.files("redis_ratelimit").joinpath("py.typed").is_file()


def test_the_functions_library_is_the_repositorys():
    shipped = resources.files("redis_ratelimit").joinpath("ratelimit.lua").read_bytes()
    assert shipped == LIBRARY.read_bytes()
