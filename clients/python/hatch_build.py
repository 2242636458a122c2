"""Copies the Functions library into the package at build time: the repository's
lua-reference/functions/ratelimit.lua (the path is the hook's `functions-library` setting in
pyproject.toml) is the one source; the package ships it as `redis_ratelimit/ratelimit.lua`.

Built from an sdist (which `python -m build` does for the wheel), the repository is not there:
the sdist carries the copy it was made with, and that copy is used.
"""

import os
import shutil

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

COPY = os.path.join("src", "redis_ratelimit", "ratelimit.lua")


class FunctionsLibraryHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        source = os.path.join(self.root, self.config["functions-library"])
        copy = os.path.join(self.root, COPY)
        if os.path.isfile(source):
            shutil.copyfile(source, copy)
        elif not os.path.isfile(copy):
            raise FileNotFoundError(
                f"the Functions library is neither at {source} (the repository's) nor at {copy}"
            )
        # Git ignores the copy: include it explicitly.
        if self.target_name == "wheel":
            build_data["force_include"][copy] = "redis_ratelimit/ratelimit.lua"
        else:
            build_data["force_include"][copy] = COPY
