"""The service's malloc settings: the arena cap is ehr-serve's default and reaches glibc in the server process."""
from __future__ import annotations

import ctypes.util
import platform

import pytest

from serving import cli
from serving.monitoring import malloc
from serving.settings import Settings


def test_the_arena_cap_is_the_default_of_ehr_serve():
    args = cli.build_parser().parse_args(["--model", "m", "--no-auth"])
    assert Settings.model_fields["malloc_arenas"].default == 2
    assert cli.settings_from_args(args, env={}).malloc_arenas == 2
    assert cli.settings_from_args(cli.build_parser().parse_args(["--model", "m", "--no-auth", "--malloc-arenas", "0"]),
                                  env={}).malloc_arenas == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not ctypes.util.find_library("c"), reason="glibc only")
def test_glibc_takes_the_cap_and_trims():
    assert malloc.cap_arenas(0) is False  # 0 keeps glibc's default: nothing is set
    assert malloc.cap_arenas(8) is True  # 8 per core is glibc's own ceiling here: harmless to the test process
    malloc.trim()
