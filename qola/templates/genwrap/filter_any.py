#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run a kernel generator so that one fnmatch filter may name several patterns.

    python filter_any.py GENERATOR.py [ARGS...]

runs GENERATOR.py with ARGS, except that inside it an fnmatch pattern containing
``|`` matches when any of its ``|``-separated parts matches (``|`` never occurs
in a kernel name), and none of its parts written ``!glob`` does (``*|!*_vc_*``:
every name but those; a receipt qola applies itself excludes names this way). CK's fMHA generator takes one fnmatch pattern per kernel kind
(``--filter`` split on ``,`` per API and on ``@`` per kind) and writes its
dispatch file over exactly the kernels that pass the filter, so one run with
``a1|b1@a2|b2@a3|b3`` generates the union of several variants *and* an API file
that dispatches to all of them. Written by qola (qola.plan.variants); standard library only.
"""

import fnmatch
import os
import runpy
import sys

SEP, NOT = "|", "!"


def _any_of(original):
    def match(name, pat):
        if isinstance(pat, str) and SEP in pat:
            parts = pat.split(SEP)
            nots = [p[1:] for p in parts if p.startswith(NOT)]
            if any(original(name, p) for p in nots):
                return False
            return any(original(name, p) for p in parts if not p.startswith(NOT))
        return original(name, pat)

    return match


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: filter_any.py GENERATOR.py [ARGS...]")
    fnmatch.fnmatch = _any_of(fnmatch.fnmatch)
    fnmatch.fnmatchcase = _any_of(fnmatch.fnmatchcase)
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
