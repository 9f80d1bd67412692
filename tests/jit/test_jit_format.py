"""The JIT cache format is defined once: qola.jit.format on the Python side, qola_jit_format.h in the
C++ runtime, both specified by docs/jit-cache.md. These tests read the runtime's sources and fail
when a constant differs, when the runtime spells one inline instead of using the header, or when a
Python module spells one instead of importing qola.jit.format."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import qola
from qola.jit import format as fmt
from qola.jit.layout import runtime_dir

RUNTIME = runtime_dir()
HEADER = RUNTIME / "qola_jit_format.h"
DOC = Path(__file__).resolve().parents[2] / "docs" / "jit-cache.md"

# C++ constant -> the Python value it must equal
STRINGS = {
    "k_tag_headers": fmt.TAG_HEADERS, "k_tag_compiler": fmt.TAG_COMPILER, "k_tag_key": fmt.TAG_KEY,
    "k_so_suffix": fmt.SO_SUFFIX, "k_meta_suffix": fmt.META_SUFFIX, "k_meta_head": fmt.META_HEAD,
    "k_logs": fmt.LOGS, "k_headers": fmt.HEADERS, "k_compilers": fmt.COMPILERS, "k_locks": fmt.LOCKS,
    "k_temp_prefix": fmt.TEMP_PREFIX, "k_temp_random": "XXXXXX",  # mkstemp's template (Python's picks its own)
    "k_stale_infix": fmt.STALE_INFIX, "k_lock_suffix": fmt.LOCK_SUFFIX, "k_log_suffix": fmt.LOG_SUFFIX,
    "k_headers_lock_prefix": fmt.HEADERS_LOCK_PREFIX, "k_complete": fmt.COMPLETE,
    "k_complete_text": fmt.COMPLETE_TEXT, "k_network_lock_dir": fmt.NETWORK_LOCK_DIR,
    "k_memo_head": fmt.MEMO_HEAD, "k_memo_suffix": fmt.MEMO_SUFFIX,
    "k_env_cache_dir": fmt.ENV_CACHE_DIR, "k_env_jit": fmt.ENV_JIT, "k_env_compiler": fmt.ENV_COMPILER,
    "k_env_prebuilt": fmt.ENV_PREBUILT, "k_env_source_dir": fmt.ENV_SOURCE_DIR, "k_env_verbose": fmt.ENV_VERBOSE,
    "k_xdg_subdir": fmt.XDG_SUBDIR, "k_home_subdir": fmt.HOME_SUBDIR, "k_prebuilt": fmt.PREBUILT,
    "k_headers_token": fmt.HEADERS_TOKEN, "k_dir_token": fmt.DIR_TOKEN,
    "k_env_usage_dir": fmt.ENV_USAGE_DIR, "k_env_coverage": fmt.ENV_COVERAGE, "k_usage_head": fmt.USAGE_HEAD,
    "k_usage_prefix": fmt.USAGE_PREFIX, "k_usage_suffix": fmt.USAGE_SUFFIX, "k_usage_ahead": fmt.USAGE_AHEAD,
}  # fmt: skip
NUMBERS = {
    "k_key_len": fmt.KEY_LEN, "k_max_size_digits": fmt.MAX_SIZE_DIGITS, "k_memo_name_len": fmt.MEMO_NAME_LEN,
    "k_dir_mode": fmt.DIR_MODE, "k_file_mode": fmt.FILE_MODE, "k_private_mode": fmt.PRIVATE_MODE,
    "k_network_stale_s": fmt.NETWORK_STALE_S, "k_max_meta": fmt.MAX_META, "k_max_memo": fmt.MAX_MEMO,
    "k_max_source": fmt.MAX_SOURCE, "k_max_object": fmt.MAX_OBJECT,
    "k_max_tree_entries": fmt.MAX_TREE_ENTRIES, "k_max_tree_depth": fmt.MAX_TREE_DEPTH,
    "k_usage_max_line": fmt.USAGE_MAX_LINE, "k_usage_max_file": fmt.USAGE_MAX_FILE,
    "k_usage_sum_len": fmt.USAGE_SUM_LEN,
}  # fmt: skip
DERIVED = {"k_n_meta_fields"}  # computed from another constant in the header


def _strip_comments(text: str) -> str:
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i) + 2
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _c_string(body: str) -> str:
    return body.encode().decode("unicode_escape")


def _c_number(expr: str) -> int:
    expr = re.sub(r"\b0([0-7]+)\b", r"0o\1", expr.strip())
    expr = re.sub(r"(?<=[0-9a-fA-F])(?:ull|ul|u|l)\b", "", expr, flags=re.I)
    assert re.fullmatch(r"[0-9a-fA-FxXo <>()+*]+", expr), expr
    return int(eval(expr))  # digits and shifts only, checked above


def _header() -> str:
    return _strip_comments(HEADER.read_text())


def test_every_constant_of_the_runtime_header_equals_the_python_one() -> None:
    text = _header()
    strings = {m[1]: _c_string(m[2]) for m in re.finditer(r'constexpr char (k_\w+)\[\] = "((?:[^"\\]|\\.)*)";', text)}
    numbers = {
        m[1]: m[2] for m in re.finditer(r"constexpr (?:size_t|mode_t|long|int|uint64_t) (k_\w+) = ([^;]+);", text)
    }
    assert strings == STRINGS
    assert set(numbers) - DERIVED == set(NUMBERS)
    assert {k: _c_number(v) for k, v in numbers.items() if k not in DERIVED} == NUMBERS

    fields = group1(r"k_meta_fields\[\] = \{([^}]*)\}", text, re.S)
    assert tuple(re.findall(r'"(\w+)"', fields)) == fmt.META_FIELDS
    subdirs = group1(r"k_subdirs\[\] = \{([^}]*)\}", text)
    assert tuple(STRINGS[name.strip()] for name in subdirs.split(",")) == fmt.SUBDIRS
    table = group1(r"k_network_fs\[\] = \{(.*?)\};", text, re.S)
    assert {int(m, 16): name for m, name in re.findall(r'\{(0x[0-9A-Fa-f]+), "(\w+)"\}', table)} == fmt.NETWORK_FS


def test_the_name_functions_agree_with_the_python_ones(tmp_path: Path) -> None:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "qola_config.h").write_text('#define QOLA_NAMESPACE fmtcheck\n#define QOLA_NAMESPACE_STR "fmtcheck"\n')
    key, sha = "a" * 64, "b" * 64
    (tmp_path / "main.cpp").write_text(
        '#include "qola_jit_format.h"\n#include <cstdio>\n'
        "using namespace qola::fmtcheck::jit::fmt;\n"
        "int main() {\n"
        f'  const char* k = "{key}"; const char* s = "{sha}";\n'
        "  for(const std::string& v : {so_name(k), meta_name(k), lock_name(k), log_name(k), temp_prefix(k),\n"
        '                              headers_lock(s), stale_aside(s, 42), in("/c", "x")})\n'
        '    std::printf("%s\\n", v.c_str());\n'
        "}\n"
    )
    exe = tmp_path / "main"
    subprocess.run(
        [
            cxx,
            "-std=c++17",
            f"-I{tmp_path}",
            f"-I{RUNTIME}",
            f"-I{RUNTIME.parent}",
            str(tmp_path / "main.cpp"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert got == [
        fmt.so_name(key),
        fmt.meta_name(key),
        fmt.lock_name(key),
        fmt.log_name(key),
        fmt.temp_prefix(key),
        fmt.headers_lock(sha),
        fmt.stale_aside(sha, 42),
        "/c/x",
    ]


def _runtime_sources() -> dict[str, str]:
    return {
        p.name: _strip_comments(p.read_text())
        for p in sorted(RUNTIME.iterdir())
        if p.suffix in (".cpp", ".h") and p != HEADER
    }


def test_the_runtime_spells_no_format_string_inline() -> None:
    env = {v for k, v in STRINGS.items() if k.startswith("k_env_")}  # messages may name a setting
    distinctive = {v for v in STRINGS.values() if len(v) >= 8 and not v.isalpha()} - env  # not a plain word
    exact = set(STRINGS.values()) - distinctive
    for name, text in _runtime_sources().items():
        for body in re.findall(r'"((?:[^"\\]|\\.)*)"', text):
            lit = _c_string(body)
            assert lit not in exact, f"{name} spells {lit!r} inline: use qola_jit_format.h"
            assert not any(v in lit for v in distinctive), f"{name} spells {lit!r}: use qola_jit_format.h"


def test_meta_fields_the_runtime_reads_are_format_fields() -> None:
    store = _runtime_sources()["qola_jit_store.cpp"]
    read = set(re.findall(r'f\["(\w+)"\]', store))
    assert read and read <= set(fmt.META_FIELDS)
    assert set(fmt.PROVENANCE) <= read


def test_generated_table_follows_the_struct_declarations() -> None:
    header = _strip_comments((RUNTIME / "qola_jit.h").read_text())

    def fields(struct: str) -> tuple[str, ...]:
        body = group1(r"struct " + struct + r" \{(.*?)\};", header, re.S)
        return tuple(re.findall(r"(\w+);", body))

    assert fields("qola_jit_entry") == fmt.ENTRY_STRUCT
    assert fields("qola_jit_module") == fmt.MODULE_STRUCT


def test_python_spells_the_format_only_in_qola_jit_format() -> None:
    """No other module writes a tag, a marker or a cache name as a literal (docstrings may describe them)."""
    contained = {
        fmt.TAG_HEADERS,
        fmt.TAG_CONTENT,
        fmt.TAG_COMPILER,
        fmt.TAG_KEY,
        fmt.META_HEAD,
        fmt.MEMO_HEAD,
        fmt.RECORD_HEAD,
        fmt.NETWORK_LOCK_DIR,
    }
    exact = {fmt.COMPLETE, fmt.INDEX_FORMAT, fmt.SECTION, fmt.HEADERS_TOKEN, fmt.DIR_TOKEN, fmt.BUNDLE}
    src = Path(qola.__file__).parent
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "format.py" and path.parent.name == "jit":
            continue
        tree = ast.parse(path.read_text())
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and (node.value in exact or any(w in node.value for w in contained))
            ):
                found.append(f"{path.relative_to(src)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_the_spec_names_every_constant() -> None:
    doc = DOC.read_text()
    for value in [*STRINGS.values(), *fmt.META_FIELDS, fmt.TAG_CONTENT, fmt.SECTION, fmt.RECORD_HEAD]:
        shown = value.replace("\n", "\\n")
        if value != "XXXXXX":
            assert shown in doc, f"docs/jit-cache.md does not mention {shown!r}"


def group1(pattern: str, text: str, flags: int = 0) -> str:
    """The first group of ``pattern``'s match in ``text`` (which must match)."""
    found = re.search(pattern, text, flags)
    assert found is not None, pattern
    return found[1]
