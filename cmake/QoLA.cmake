# cmake/QoLA.cmake - qola's CMake module, call-compatible with QoLA's file of the same name.
#
# A project that includes QoLA's module from a QoLA checkout includes this one from a qola
# checkout instead, with no other change:
#
#   include(${QOLA_DIR}/cmake/QoLA.cmake)
#   qola_add_modules(
#     GROUP            ck_fused_attn                       # [[modules]] group = "..." of the manifest
#     MANIFEST         ${CMAKE_CURRENT_LIST_DIR}/qola_manifest.toml
#     BUILD_DIR        ${CMAKE_CURRENT_BINARY_DIR}/qola    # qola's output dir (OUT)
#     ARCHS            gfx942 gfx950                       # a CMake list; empty: the manifest's
#     OUT_INCLUDE_DIR  QOLA_INCLUDE_DIR                    # OUT/include
#     OUT_LIB_DIR      QOLA_LIB_DIR                        # OUT/lib
#     OUT_LIBS         QOLA_LIBS                           # file names: te_libmha_fwd.so;...
#     OUT_CONFIG_DIR   QOLA_CONFIG_DIR                     # OUT/configs
#     OUT_AITER_DIR    QOLA_AITER_SOURCE_DIR               # the kernel tree it built from
#     OUT_TARGETS      QOLA_TARGETS)                       # qola only: qola::<ns>::<module> targets
#
# Functions (QoLA's names, arguments and results):
#   qola_checkout_aiter(MANIFEST m [AITER_DIR d | DEFAULT_DIR d] [GROUPS g...] OUT_DIR var)
#       `qola checkout` of the manifest's pinned tree into d (once per commit and dir per configure).
#   qola_build_modules(GROUP g MANIFEST m BUILD_DIR out AITER_DIR tree [ARCHS a...] [LIBS f...]
#                      [OUT_INCLUDE_DIR v] [OUT_LIB_DIR v] [OUT_LIBS v] [OUT_CONFIG_DIR v] [OUT_TARGETS v])
#       `qola build --group g --skip-checkout` against a tree already checked out.
#   qola_add_modules(...)  both of the above; the tree defaults to <BUILD_DIR>/third_party/aiter.
#   qola_read_manifest_commit(manifest var), qola_find_python(var), qola_run_cli(what args...),
#   qola_prebuilt_dir(group var): QoLA's helpers.
#
# Environment:
#   QOLA_AITER_SOURCE_DIR, NVTE_AITER_SOURCE_DIR  build against this tree; no checkout. qola reports a
#       tree whose commit is not the manifest's pin as a warning (recorded in OUT/manifest.json).
#   QOLA_PREBUILT_DIR_<GROUP>  (GROUP upper-cased) what to use instead of building the group:
#       * a finished output (lib/ and include/, as QoLA reads it): used as it is, nothing is built;
#       * a directory of build-key archives (`qola package`, `qola build --publish`: <ns>-<key>.tar.gz)
#         or an http(s):// URL of one: `qola build --prebuilt <it>` installs the archive of exactly
#         this build's key into BUILD_DIR (checked: sha256, key, audit), or builds when there is none.
#       A relative path is taken from the calling CMakeLists.txt's directory (CMAKE_CURRENT_SOURCE_DIR);
#       the OUT_* dirs are absolute. A finished output must match QOLA_JIT (ON: built with [jit]; OFF:
#       without) and carry jit/ for its JIT modules, else the configure stops naming both.
#
# Cache variables (qola only): QOLA_BUILD_ARGS - extra arguments for every `qola build` (e.g.
# "-j;8;--launcher;sccache"); QOLA_PYTHON - the interpreter (default: Python_EXECUTABLE, else found);
# QOLA_JIT - ON/OFF: `qola build --jit on|off` (TE's CK_JIT mode), empty: the manifest decides.
#
# The CLI runs as QoLA runs it: `PYTHONPATH=<this checkout> python -m qola.cli ...`; from a pip
# install (no qola/ beside this file) the installed qola is used. Its output streams to the console;
# a failure stops the configure step with qola's own error message.

include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.16)
  message(FATAL_ERROR "[qola] cmake/QoLA.cmake needs CMake 3.16 or newer (this is ${CMAKE_VERSION})")
endif()

set(QOLA_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(QOLA_ROOT_DIR "${QOLA_CMAKE_DIR}/.." ABSOLUTE)
set(QOLA_BUILD_ARGS "" CACHE STRING "extra arguments for every `qola build` run by QoLA.cmake (a list)")

# Every message this file prints goes through here: message(<mode> <text>...), with a URL's
# credentials (scheme://user:password@host) shown as *** whatever their characters (a raw '#', '?',
# space or '@' in a password; a raw '/' after a "port" that is no number), as qola shows them
# (qola/core/secret.py): neither QOLA_PREBUILT_DIR_<GROUP> nor QOLA_BUILD_ARGS (`--prebuilt;URL`)
# nor a path is printed with one.
function(_qola_message mode)
  set(_text "")
  math(EXPR _last "${ARGC} - 1")
  if(_last GREATER 0)
    foreach(_i RANGE 1 ${_last})
      string(APPEND _text "${ARGV${_i}}")
    endforeach()
  endif()
  set(_scheme "([A-Za-z][A-Za-z0-9+.-]*://)")
  string(REGEX REPLACE "${_scheme}[^/@ \t\n]*:[^0-9/@ \t\n][^@ \t\n]*@" "\\1***@" _text "${_text}")
  string(REGEX REPLACE "${_scheme}[^/\n]*@" "\\1***@" _text "${_text}")
  message(${mode} "${_text}")
endfunction()

# The value of `aiter_commit = "..."` in a manifest ("" when it pins none; qola does not require a pin).
function(qola_read_manifest_commit manifest out_var)
  if(NOT EXISTS "${manifest}" OR IS_DIRECTORY "${manifest}")
    _qola_message(FATAL_ERROR "[qola] manifest not found: ${manifest}")
  endif()
  file(STRINGS "${manifest}" _lines REGEX "^[ \t]*aiter_commit[ \t]*=")
  list(LENGTH _lines _count)
  if(_count EQUAL 0)
    set(${out_var} "" PARENT_SCOPE)
    return()
  endif()
  if(NOT _count EQUAL 1)
    _qola_message(FATAL_ERROR "[qola] ${manifest} has ${_count} 'aiter_commit = ...' lines; a manifest pins one commit.")
  endif()
  if(NOT _lines MATCHES "^[ \t]*aiter_commit[ \t]*=[ \t]*[\"']([0-9A-Za-z._/-]+)[\"']")
    _qola_message(FATAL_ERROR "[qola] cannot read the aiter_commit line of ${manifest}: ${_lines}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# The Python interpreter that runs qola: QOLA_PYTHON, the caller's Python_EXECUTABLE, or one found.
function(qola_find_python out_var)
  foreach(_v QOLA_PYTHON Python_EXECUTABLE Python3_EXECUTABLE)
    if(${_v})
      set(${out_var} "${${_v}}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  find_package(Python COMPONENTS Interpreter QUIET)
  if(NOT Python_EXECUTABLE)
    _qola_message(FATAL_ERROR "[qola] no Python interpreter found; qola needs one to check out and build the kernels "
                        "(set Python_EXECUTABLE or QOLA_PYTHON).")
  endif()
  set(${out_var} "${Python_EXECUTABLE}" PARENT_SCOPE)
endfunction()

# A value for a CMake list that stays one element: a ';' in it (a directory named "a;b") escaped.
function(_qola_arg value out_var)
  string(REPLACE ";" "\\;" _escaped "${value}")
  set(${out_var} "${_escaped}" PARENT_SCOPE)
endfunction()

# `python -m qola.cli <args...>`; a failure is a FATAL_ERROR naming `what` with qola's message.
# Each argument is one argument of qola's, whatever it holds (a path with ';' or '='): it is read
# from ARGV<n>, never from the ;-separated ARGN. A list variable (`--arch "a;b"`, QOLA_BUILD_ARGS)
# expanded unquoted in the call is split into arguments, as CMake does; an element meant to keep a
# ';' is escaped first (_qola_arg).
function(qola_run_cli what)
  qola_find_python(_py)
  set(_args)
  set(_shown)
  math(EXPR _last "${ARGC} - 1")
  if(_last GREATER 0)
    foreach(_i RANGE 1 ${_last})
      _qola_arg("${ARGV${_i}}" _a)
      list(APPEND _args "${_a}")
      string(APPEND _shown " ${ARGV${_i}}")
    endforeach()
  endif()
  set(_echo)
  if(NOT CMAKE_VERSION VERSION_LESS 3.18)
    set(_echo ECHO_OUTPUT_VARIABLE ECHO_ERROR_VARIABLE)
  endif()
  _qola_message(STATUS "[qola] python -m qola.cli${_shown}")
  # PYTHONPATH for qola's child only: set around the one execute_process and put back (never
  # `cmake -E env NAME=VALUE <python>`, which reads an interpreter path holding '=' as one more NAME=VALUE)
  set(_had_pythonpath FALSE)
  if(DEFINED ENV{PYTHONPATH})
    set(_had_pythonpath TRUE)
  endif()
  set(_saved_pythonpath "$ENV{PYTHONPATH}")
  if(EXISTS "${QOLA_ROOT_DIR}/qola/cli.py")
    if(_saved_pythonpath STREQUAL "")
      set(ENV{PYTHONPATH} "${QOLA_ROOT_DIR}")
    else()
      set(ENV{PYTHONPATH} "${QOLA_ROOT_DIR}:${_saved_pythonpath}")
    endif()
  endif()
  execute_process(
    COMMAND "${_py}" -m qola.cli ${_args}
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _err
    ${_echo})
  if(_had_pythonpath)
    set(ENV{PYTHONPATH} "${_saved_pythonpath}")
  else()
    unset(ENV{PYTHONPATH})
  endif()
  if(NOT _rc EQUAL 0)
    if(_rc EQUAL 2)
      set(_kind "refused (exit 2: a problem with the inputs)")
    elseif(_rc EQUAL 1)
      set(_kind "failed (exit 1)")
    else()
      set(_kind "failed (${_rc})")
    endif()
    string(STRIP "${_err}" _err)
    if(_err STREQUAL "")
      string(STRIP "${_out}" _err)
    endif()
    string(LENGTH "${_err}" _len)
    if(_len GREATER 6000)  # the build's log is above; keep the message to its end
      math(EXPR _from "${_len} - 6000")
      string(SUBSTRING "${_err}" ${_from} -1 _err)
      set(_err "...${_err}")
    endif()
    _qola_message(FATAL_ERROR "[qola] ${what} ${_kind}:\n${_err}")
  endif()
endfunction()

# QOLA_PREBUILT_DIR_<GROUP> (GROUP upper-cased), or "".
function(qola_prebuilt_dir group out_var)
  string(TOUPPER "${group}" _uc)
  if(DEFINED ENV{QOLA_PREBUILT_DIR_${_uc}} AND NOT "$ENV{QOLA_PREBUILT_DIR_${_uc}}" STREQUAL "")
    set(${out_var} "$ENV{QOLA_PREBUILT_DIR_${_uc}}" PARENT_SCOPE)
  else()
    set(${out_var} "" PARENT_SCOPE)
  endif()
endfunction()

# QOLA_PREBUILT_DIR_<GROUP> resolved: dir_var gets the absolute directory (or the URL), kind_var what
# it is: "output" (lib/ + include/, used as it is), "store" (build-key archives or a URL: `qola build
# --prebuilt`), or "" when the variable is unset. A relative path is taken from the directory of the
# CMakeLists.txt that calls (CMAKE_CURRENT_SOURCE_DIR), where QoLA's module looks for the libraries
# (its file(GLOB)) and where CMake's target_include_directories / target_link_directories put the
# relative dirs QoLA hands back; qola hands back the absolute path.
function(_qola_prebuilt group dir_var kind_var)
  qola_prebuilt_dir("${group}" dir)
  string(TOUPPER "${group}" _uc)
  set(${dir_var} "${dir}" PARENT_SCOPE)
  set(${kind_var} "" PARENT_SCOPE)
  if(dir STREQUAL "")
    return()
  endif()
  if(dir MATCHES "^[Hh][Tt][Tt][Pp][Ss]?://")
    set(${kind_var} store PARENT_SCOPE)
    return()
  endif()
  set(_said "QOLA_PREBUILT_DIR_${_uc}=${dir}")
  if(NOT IS_ABSOLUTE "${dir}")
    get_filename_component(dir "${dir}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    set(_said "${_said} (relative to ${CMAKE_CURRENT_SOURCE_DIR}: ${dir})")
    set(${dir_var} "${dir}" PARENT_SCOPE)
  endif()
  if(NOT IS_DIRECTORY "${dir}")
    _qola_message(FATAL_ERROR "[qola] ${_said} is not a directory.")
  endif()
  if(IS_DIRECTORY "${dir}/lib" AND IS_DIRECTORY "${dir}/include")
    _qola_prebuilt_jit("${_said}" "${dir}")
    set(${kind_var} output PARENT_SCOPE)
    return()
  endif()
  file(GLOB _archives "${dir}/*.tar.gz")
  if(_archives)
    set(${kind_var} store PARENT_SCOPE)
    return()
  endif()
  _qola_message(FATAL_ERROR
    "[qola] ${_said} holds neither a finished output (lib/ and include/) nor "
    "build-key archives (<namespace>-<key>.tar.gz, written by `qola package` or `qola build --publish`).")
endfunction()

# A finished prebuilt output used as it is must be what QOLA_JIT asks for: its manifest.json records
# per module a `jit` object ({"dir": "jit/<ns>_<module>", ...}) when the module was built with [jit].
# QOLA_JIT=ON and no such module, or OFF and some (or, whatever manifest.json says, a jit/<ns>_<module>
# dir of sources), is an error naming both; a JIT module whose jit/ dir is missing (stubs shipped
# without their sources) is one whatever QOLA_JIT says.
function(_qola_prebuilt_jit said root)
  _qola_jit_value(_want)
  if(CMAKE_VERSION VERSION_LESS 3.19)  # string(JSON)
    if(NOT _want STREQUAL "")
      _qola_message(WARNING "[qola] ${said}: QOLA_JIT=${QOLA_JIT} cannot be checked against the output's "
                      "manifest.json before CMake 3.19; make sure it was built with --jit ${_want}.")
    endif()
    return()
  endif()
  set(_jit)
  set(_ahead)
  set(_count 0)
  if(EXISTS "${root}/manifest.json")
    file(READ "${root}/manifest.json" _json)
    string(JSON _count ERROR_VARIABLE _err LENGTH "${_json}" modules)
    if(_err)
      set(_count 0)
    endif()
  endif()
  if(_count GREATER 0)
    math(EXPR _last "${_count} - 1")
    foreach(_i RANGE ${_last})
      string(JSON _name ERROR_VARIABLE _err GET "${_json}" modules ${_i} name)
      string(JSON _type ERROR_VARIABLE _err TYPE "${_json}" modules ${_i} jit)
      if(NOT _type STREQUAL "OBJECT")
        list(APPEND _ahead "${_name}")
        continue()
      endif()
      list(APPEND _jit "${_name}")
      string(JSON _dir ERROR_VARIABLE _err GET "${_json}" modules ${_i} jit dir)
      if(_err OR NOT IS_DIRECTORY "${root}/${_dir}")
        _qola_message(FATAL_ERROR
          "[qola] ${said}: module ${_name} was built with [jit] (its kernels are stubs compiled on first "
          "call), but ${root}/${_dir} is missing: the stubs cannot compile without their sources. A prebuilt "
          "output of JIT libraries carries jit/ beside lib/ (docs/coming-from-qola.md, \"Prebuilt caches\").")
      endif()
    endforeach()
  endif()
  if(_want STREQUAL "on" AND NOT _jit)
    string(REPLACE ";" ", " _ahead "${_ahead}")
    _qola_message(FATAL_ERROR
      "[qola] QOLA_JIT=${QOLA_JIT} asks for JIT libraries (TE's CK_JIT mode), but ${said} holds an output "
      "built without [jit] (${root}/manifest.json records no JIT module; built ahead: ${_ahead}). Point "
      "it at an output built with `qola build --jit on`, or leave QOLA_JIT empty to use these libraries.")
  elseif(_want STREQUAL "off" AND _jit)
    string(REPLACE ";" ", " _jit "${_jit}")
    _qola_message(FATAL_ERROR
      "[qola] QOLA_JIT=${QOLA_JIT} asks for every kernel ahead, but ${said} holds an output built with "
      "[jit] (${_jit} compile their kernels on first call). Point it at an output built with "
      "`qola build --jit off`, or leave QOLA_JIT empty to use these libraries.")
  elseif(_want STREQUAL "off")
    # what the output holds, not only what its manifest.json says (it may be gone, or not qola's):
    # a JIT module's sources live in jit/<ns>_<module>/
    file(GLOB _held LIST_DIRECTORIES true RELATIVE "${root}/jit" "${root}/jit/*")
    set(_sources)
    foreach(_entry IN LISTS _held)
      if(IS_DIRECTORY "${root}/jit/${_entry}")
        list(APPEND _sources "${_entry}")
      endif()
    endforeach()
    if(_sources)
      list(SORT _sources)
      string(REPLACE ";" ", " _sources "${_sources}")
      _qola_message(FATAL_ERROR
        "[qola] QOLA_JIT=${QOLA_JIT} asks for every kernel ahead, but ${said} holds the JIT's sources "
        "(${root}/jit/: ${_sources}): an output built with [jit], whatever ${root}/manifest.json says (it "
        "records no JIT module, or is missing). Point it at an output built with `qola build --jit off`, "
        "or leave QOLA_JIT empty to use these libraries.")
    endif()
  endif()
endfunction()

# The kernel tree's include dir exists (a development tree: csrc/; an sdist/installed tree: aiter_meta/csrc/).
function(_qola_check_tree dir what)
  if(NOT IS_DIRECTORY "${dir}/csrc/include" AND NOT IS_DIRECTORY "${dir}/aiter_meta/csrc/include")
    _qola_message(FATAL_ERROR "[qola] ${what}: ${dir} is not a kernel tree (no csrc/include or aiter_meta/csrc/include).")
  endif()
endfunction()

# Every function reads its arguments with cmake_parse_arguments(PARSE_ARGV ...): a value holding ';'
# (a path under a directory named "a;b") stays one value.
#
# A mistake in a call: an argument the function does not know, an OUT_* keyword without the name of
# its variable (`OUT_LIBS LIBS ...`: LIBS is a keyword, so OUT_LIBS got nothing), or a required keyword
# (the names after ``prefix``) not given. An empty input value (`AITER_DIR ""`, no ARCHS) means "not
# given", as in QoLA.
macro(_qola_check_args fn prefix)
  if(${prefix}_UNPARSED_ARGUMENTS)
    _qola_message(FATAL_ERROR "[qola] ${fn}: unknown arguments ${${prefix}_UNPARSED_ARGUMENTS}")
  endif()
  foreach(_qola_kw IN LISTS ${prefix}_KEYWORDS_MISSING_VALUES)
    if(_qola_kw MATCHES "^OUT_")
      _qola_message(FATAL_ERROR "[qola] ${fn}: ${_qola_kw} is given without the name of a variable")
    endif()
  endforeach()
  foreach(_qola_kw ${ARGN})
    if(NOT ${prefix}_${_qola_kw})
      _qola_message(FATAL_ERROR "[qola] ${fn}: ${_qola_kw} is required.")
    endif()
  endforeach()
endmacro()

# Check out the manifest's tree, unless QOLA_AITER_SOURCE_DIR / NVTE_AITER_SOURCE_DIR names one.
function(qola_checkout_aiter)
  set(_one MANIFEST AITER_DIR DEFAULT_DIR OUT_DIR)
  cmake_parse_arguments(PARSE_ARGV 0 QCA "" "${_one}" "GROUPS")
  _qola_check_args(qola_checkout_aiter QCA MANIFEST)
  if(NOT QCA_OUT_DIR)
    _qola_message(FATAL_ERROR "[qola] qola_checkout_aiter: OUT_DIR (the variable that receives the tree) is required.")
  endif()
  if(QCA_AITER_DIR)
    set(QCA_DEFAULT_DIR "${QCA_AITER_DIR}")
  endif()
  if(NOT QCA_DEFAULT_DIR)
    _qola_message(FATAL_ERROR "[qola] qola_checkout_aiter: AITER_DIR or DEFAULT_DIR (where the tree goes) is required.")
  endif()
  get_filename_component(_manifest "${QCA_MANIFEST}" ABSOLUTE)
  qola_read_manifest_commit("${_manifest}" _sha)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_manifest}")

  set(_dir "")
  foreach(_env QOLA_AITER_SOURCE_DIR NVTE_AITER_SOURCE_DIR)
    if(DEFINED ENV{${_env}} AND NOT "$ENV{${_env}}" STREQUAL "")
      set(_dir "$ENV{${_env}}")
      _qola_message(STATUS "[qola] kernel tree from ${_env}=${_dir}; no checkout")
      break()
    endif()
  endforeach()
  if(_dir STREQUAL "")
    get_filename_component(_dir "${QCA_DEFAULT_DIR}" ABSOLUTE)
    get_property(_done GLOBAL PROPERTY "QOLA_CHECKOUT_DONE_${_sha}_${_dir}")
    if(_done)
      _qola_message(STATUS "[qola] ${_dir} already checked out at ${_sha} in this configure")
    else()
      set(_groups)
      foreach(_g IN LISTS QCA_GROUPS)
        _qola_arg("${_g}" _g)
        list(APPEND _groups --group "${_g}")
      endforeach()
      qola_run_cli("checkout of ${_dir}" checkout --manifest "${_manifest}" --aiter-root "${_dir}" ${_groups})
      set_property(GLOBAL PROPERTY "QOLA_CHECKOUT_DONE_${_sha}_${_dir}" TRUE)
    endif()
  endif()
  _qola_check_tree("${_dir}" "qola_checkout_aiter")
  set(${QCA_OUT_DIR} "${_dir}" PARENT_SCOPE)
endfunction()

# lib/ file names of the group (LIBS, checked; else every *.so, else every *.a) into out_var.
function(_qola_libs group lib_dir libs out_var)
  set(_found)
  if(libs)
    foreach(_lib IN LISTS libs)
      if(NOT EXISTS "${lib_dir}/${_lib}")
        _qola_message(FATAL_ERROR "[qola] ${group}: expected library ${_lib} is not in ${lib_dir}.")
      endif()
      list(APPEND _found "${_lib}")
    endforeach()
  else()
    file(GLOB _found RELATIVE "${lib_dir}" "${lib_dir}/*.so")
    if(NOT _found)
      file(GLOB _found RELATIVE "${lib_dir}" "${lib_dir}/*.a")
    endif()
    if(NOT _found)
      _qola_message(FATAL_ERROR "[qola] ${group}: no libraries in ${lib_dir}.")
    endif()
    list(SORT _found)
  endif()
  set(${out_var} "${_found}" PARENT_SCOPE)
endfunction()

# qola::<ns>::<module> imported targets for `libs`, from the output's qola-<ns> CMake package (none
# when `root` has no package: an output QoLA wrote).
function(_qola_targets root libs out_var)
  file(GLOB _cfgs "${root}/share/cmake/qola-*/qola-*-config.cmake")
  set(_targets)
  list(LENGTH _cfgs _n)
  if(_n EQUAL 1)
    get_filename_component(_cfgdir "${_cfgs}" DIRECTORY)
    get_filename_component(_pkg "${_cfgdir}" NAME)
    string(REGEX REPLACE "^qola-" "" _ns "${_pkg}")
    # a later call may point at another output: the package is found where this one is
    unset(${_pkg}_DIR CACHE)
    find_package(${_pkg} CONFIG REQUIRED NO_DEFAULT_PATH PATHS "${_cfgdir}")
    foreach(_lib IN LISTS libs)
      string(REGEX REPLACE "\\.(so|a)$" "" _mod "${_lib}")
      string(REGEX REPLACE "^${_ns}_" "" _mod "${_mod}")
      if(TARGET "qola::${_ns}::${_mod}")
        list(APPEND _targets "qola::${_ns}::${_mod}")
      endif()
    endforeach()
    if(libs AND NOT _targets)
      _qola_message(FATAL_ERROR
        "[qola] OUT_TARGETS: none of ${libs} in ${root}/lib is a linkable library (qola::${_ns}:: has no "
        "target for them): Python extension modules (pybind) are imported, not linked. Drop OUT_TARGETS "
        "for this group and use OUT_LIB_DIR / OUT_LIBS.")
    endif()
  elseif(_n GREATER 1)
    _qola_message(FATAL_ERROR "[qola] ${root} holds ${_n} CMake packages (${_cfgs}); one output dir holds one namespace.")
  endif()
  set(${out_var} "${_targets}" PARENT_SCOPE)
endfunction()

# Build one group against a checked-out tree (or use QOLA_PREBUILT_DIR_<GROUP>).
function(qola_build_modules)
  set(_one GROUP MANIFEST BUILD_DIR AITER_DIR OUT_INCLUDE_DIR OUT_LIB_DIR OUT_LIBS OUT_CONFIG_DIR OUT_TARGETS)
  cmake_parse_arguments(PARSE_ARGV 0 QBM "" "${_one}" "ARCHS;LIBS")
  _qola_check_args(qola_build_modules QBM GROUP BUILD_DIR)
  get_filename_component(_out "${QBM_BUILD_DIR}" ABSOLUTE)
  _qola_prebuilt("${QBM_GROUP}" _prebuilt _kind)

  if(_kind STREQUAL "output")
    _qola_message(STATUS "[qola] ${QBM_GROUP}: prebuilt libraries from ${_prebuilt}; nothing is built")
    set(_root "${_prebuilt}")
  else()
    if(NOT QBM_MANIFEST)
      _qola_message(FATAL_ERROR "[qola] qola_build_modules: MANIFEST is required.")
    endif()
    if(NOT QBM_AITER_DIR)
      _qola_message(FATAL_ERROR "[qola] qola_build_modules: AITER_DIR is required: this function only builds. Run "
                          "qola_checkout_aiter() first and pass its OUT_DIR, or call qola_add_modules().")
    endif()
    get_filename_component(_manifest "${QBM_MANIFEST}" ABSOLUTE)
    get_filename_component(_tree "${QBM_AITER_DIR}" ABSOLUTE)
    _qola_check_tree("${_tree}" "${QBM_GROUP}: AITER_DIR")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_manifest}")
    # QoLA's output dir accumulates the groups built into it; a qola output holds what one build
    # produced. So every group of this manifest built into this BUILD_DIR during this configure is
    # built again with the new one (compiled once: the objects are kept in <BUILD_DIR>.build), and the
    # libraries of an earlier qola_add_modules() call stay in lib/.
    set(_key "QOLA_GROUPS_IN_${_out}|${_manifest}")
    get_property(_groups GLOBAL PROPERTY "${_key}")
    if(NOT QBM_GROUP IN_LIST _groups)
      list(APPEND _groups "${QBM_GROUP}")
      set_property(GLOBAL PROPERTY "${_key}" "${_groups}")
    endif()
    _qola_arg("${_manifest}" _m)
    _qola_arg("${_tree}" _t)
    _qola_arg("${_out}" _o)
    set(_args build --manifest "${_m}" --aiter-root "${_t}" --output-dir "${_o}" --skip-checkout)
    foreach(_g IN LISTS _groups)
      _qola_arg("${_g}" _g)
      list(APPEND _args --group "${_g}")
    endforeach()
    set(_shown "")
    string(REPLACE "\\;" ";" _archs "${QBM_ARCHS}")  # ARCHS "${list}" quoted: still a list of archs
    foreach(_a IN LISTS _archs)
      string(STRIP "${_a}" _a)
      if(NOT _a STREQUAL "")
        _qola_arg("${_a}" _ae)
        list(APPEND _args --arch "${_ae}")
        string(APPEND _shown " ${_a}")
      endif()
    endforeach()
    if(_kind STREQUAL "store")
      _qola_arg("${_prebuilt}" _p)
      list(APPEND _args --prebuilt "${_p}")
      _qola_message(STATUS "[qola] ${QBM_GROUP}: installing the build-key archive from ${_prebuilt} (or building)")
    endif()
    if(_shown STREQUAL "")
      set(_shown " (the manifest's architectures)")
    endif()
    list(JOIN _groups ", " _with)
    _qola_message(STATUS "[qola] ${QBM_GROUP}: building group(s) ${_with} for${_shown} into ${_out}")
    _qola_jit_args("${QBM_GROUP}" _args)
    qola_run_cli("build of group '${QBM_GROUP}'" ${_args} ${QOLA_BUILD_ARGS})
    set(_root "${_out}")
  endif()

  if(NOT EXISTS "${_root}/include/qola_config.h")
    _qola_message(FATAL_ERROR "[qola] ${QBM_GROUP}: public headers missing at ${_root}/include (no qola_config.h).")
  endif()
  _qola_libs("${QBM_GROUP}" "${_root}/lib" "${QBM_LIBS}" _libs)
  if(QBM_OUT_TARGETS)
    _qola_targets("${_root}" "${_libs}" _targets)
    set(${QBM_OUT_TARGETS} "${_targets}" PARENT_SCOPE)
  endif()
  if(QBM_OUT_INCLUDE_DIR)
    set(${QBM_OUT_INCLUDE_DIR} "${_root}/include" PARENT_SCOPE)
  endif()
  if(QBM_OUT_LIB_DIR)
    set(${QBM_OUT_LIB_DIR} "${_root}/lib" PARENT_SCOPE)
  endif()
  if(QBM_OUT_LIBS)
    set(${QBM_OUT_LIBS} "${_libs}" PARENT_SCOPE)
  endif()
  if(QBM_OUT_CONFIG_DIR)
    set(${QBM_OUT_CONFIG_DIR} "${_root}/configs" PARENT_SCOPE)
  endif()
endfunction()

# qola only: Transformer Engine's CK_JIT switch (docs/coming-from-qola.md, "TE's CK_JIT mode").
#   ON: `qola build --jit on`: every generated CK instance becomes a stub compiled on first call
#       (the sources go to BUILD_DIR/jit: keep it beside lib/); OFF: `--jit off`; empty: the manifest decides.
# A QOLA_PREBUILT_DIR_<GROUP> is tried first either way (an archive store by the key of the build asked).
set(QOLA_JIT "" CACHE STRING "ON: defer every generated kernel to the on-demand JIT; OFF: all ahead; empty: the manifest's [jit]")
# QOLA_JIT as "on", "off" or "" (the manifest decides); anything else is an error.
function(_qola_jit_value out_var)
  if("${QOLA_JIT}" STREQUAL "")
    set(_v "")
  elseif(QOLA_JIT MATCHES "^(ON|On|on|1|TRUE|True|true|YES|Yes|yes)$")
    set(_v on)
  elseif(QOLA_JIT MATCHES "^(OFF|Off|off|0|FALSE|False|false|NO|No|no)$")
    set(_v off)
  else()
    _qola_message(FATAL_ERROR "[qola] QOLA_JIT='${QOLA_JIT}' is neither ON nor OFF (empty: the manifest's [jit] decides).")
  endif()
  set(${out_var} "${_v}" PARENT_SCOPE)
endfunction()

function(_qola_jit_args group args_var)
  _qola_jit_value(_v)
  if(_v STREQUAL "")
    return()
  endif()
  _qola_message(STATUS "[qola] ${group}: JIT ${_v} (QOLA_JIT)")
  set(${args_var} ${${args_var}} --jit ${_v} PARENT_SCOPE)
endfunction()

# Check out (unless AITER_DIR is given or the group is prebuilt) and build one group.
function(qola_add_modules)
  set(_one GROUP MANIFEST BUILD_DIR AITER_DIR
           OUT_INCLUDE_DIR OUT_LIB_DIR OUT_LIBS OUT_AITER_DIR OUT_CONFIG_DIR OUT_TARGETS)
  cmake_parse_arguments(PARSE_ARGV 0 QAM "" "${_one}" "ARCHS;LIBS")
  _qola_check_args(qola_add_modules QAM GROUP MANIFEST BUILD_DIR)
  _qola_prebuilt("${QAM_GROUP}" _prebuilt _kind)
  set(_tree "${QAM_AITER_DIR}")
  # a finished prebuilt output needs no tree; an archive store does (the build key reads the tree)
  if(NOT _tree AND NOT _kind STREQUAL "output")
    qola_checkout_aiter(MANIFEST "${QAM_MANIFEST}" DEFAULT_DIR "${QAM_BUILD_DIR}/third_party/aiter"
                        GROUPS "${QAM_GROUP}" OUT_DIR _tree)
  endif()
  set(_want_targets)  # only when asked: a group of Python modules has none (an error when asked)
  if(QAM_OUT_TARGETS)
    set(_want_targets OUT_TARGETS _targets)
  endif()
  qola_build_modules(
    GROUP "${QAM_GROUP}" MANIFEST "${QAM_MANIFEST}" BUILD_DIR "${QAM_BUILD_DIR}" AITER_DIR "${_tree}"
    ARCHS ${QAM_ARCHS} LIBS ${QAM_LIBS}
    OUT_INCLUDE_DIR _inc OUT_LIB_DIR _lib OUT_LIBS _libs OUT_CONFIG_DIR _cfg ${_want_targets})
  foreach(_pair "INCLUDE_DIR;_inc" "LIB_DIR;_lib" "LIBS;_libs" "CONFIG_DIR;_cfg" "AITER_DIR;_tree" "TARGETS;_targets")
    list(GET _pair 0 _name)
    list(GET _pair 1 _local)
    if(QAM_OUT_${_name})
      set(${QAM_OUT_${_name}} "${${_local}}" PARENT_SCOPE)
    endif()
  endforeach()
endfunction()
