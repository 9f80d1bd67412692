"""The include scanner's safe answer (qola/compile/includes.py): ``reaches`` says False only when no
include of the unit, whatever its form, can name one of the target files."""

from __future__ import annotations

from pathlib import Path

from qola.compile.includes import HeaderScanner, search_path


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def test_every_form_that_names_a_file_is_followed(tmp_path: Path) -> None:
    t = _tree(
        tmp_path,
        {
            "a/fixed.h": "int fixed;\n",
            "b/fixed.h": "#include_next <fixed.h>\n",
            "b/plain.h": "int plain;\n",
            "src/next.cpp": '#include "../b/fixed.h"\n',
            "src/has.cpp": "#if __has_include(<fixed.h>)\n#endif\n",
            "src/quiet.cpp": '#include "plain.h"\n#include <vector>\n',
            "src/dead.cpp": "#if 0\n#include <fixed.h>\n#endif\n",
        },
    )
    target = {t / "a" / "fixed.h"}
    scan = HeaderScanner([t / "b", t / "a"])
    assert scan.reaches(t / "src" / "next.cpp", target)  # include_next: the later dir's file
    assert scan.reaches(t / "src" / "has.cpp", target)  # __has_include names it
    assert scan.reaches(t / "src" / "dead.cpp", target)  # #if 0 is not evaluated: the safe side
    assert not scan.reaches(t / "src" / "quiet.cpp", target)
    assert scan.closure(t / "src" / "quiet.cpp") == [t / "b" / "plain.h"]  # first match; <vector> is no tree file


def test_a_macro_include_or_an_unreadable_header_may_read_anything(tmp_path: Path) -> None:
    t = _tree(
        tmp_path,
        {
            "inc/x.h": "int x;\n",
            "src/macro.cpp": "#define H <x.h>\n#include H\n",
            "src/broken.cpp": '#include "gone.h"\n',
        },
    )
    (t / "inc" / "gone.h").symlink_to(t / "nowhere")  # resolves to no file: not a candidate
    scan = HeaderScanner([t / "inc"])
    assert scan.reaches(t / "src" / "macro.cpp", {t / "elsewhere.h"})
    assert not scan.reaches(t / "src" / "broken.cpp", {t / "elsewhere.h"})
    assert scan.reaches(t / "src" / "missing.cpp", {t / "elsewhere.h"})  # unreadable: the safe side


def test_a_compile_lines_search_path_in_the_compilers_order() -> None:
    flags = ["-DX", "-Ia", "-isystem", "b", "-iquote", "c", "-include", "f.h", "-I", "d", "-isystemb2"]
    assert search_path(flags) == (("c", "a", "d", "b", "b2"), ("f.h",))
