"""The wheel's build hook: ge2jit's C launch path (ge2jit/jit/_fastlaunch.c) built with the
machine's C compiler into the wheel, which is then tagged for this interpreter and platform.
Where it cannot be built (no compiler, no Python headers) the wheel stays pure Python, said
on stderr, and an install builds the module at first use, or takes the Python path."""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CompiledLaunchHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel" or version == "editable":
            return   # an editable install builds the module into its cache at first use
        path = Path(self.root) / "ge2jit" / "jit" / "cbuild.py"
        spec = importlib.util.spec_from_file_location("_ge2jit_cbuild", path)
        cbuild = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cbuild)
        name = f"_fastlaunch{sysconfig.get_config_var('EXT_SUFFIX')}"
        output = Path(tempfile.mkdtemp(prefix="ge2jit-build-")) / name
        try:
            cbuild.build(output)
        except RuntimeError as e:
            print(f"ge2jit: the compiled launch path is not in this wheel ({e}); it is built "
                  "at first use where a C compiler is present", file=sys.stderr)
            return
        build_data["force_include"][str(output)] = f"ge2jit/jit/{name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
