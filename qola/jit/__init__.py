"""On-demand JIT (C level): deferred instances compiled on first use inside the library.

Pieces (each module has one job):

* :mod:`qola.jit.cxx`      reads generated instance files (``template <>`` specialisations)
* :mod:`qola.jit.stubs`    instance file -> library stub + JIT copy (styles: example_attn, ck_fmha)
* :mod:`qola.jit.headers`  header closure of a unit, deterministic ``headers.tar.gz``
* :mod:`qola.jit.key`      the key definition shared with the C++ runtime
* :mod:`qola.jit.layout`   writes ``OUT/jit/<module>/`` + stubs + the runtime's table (build engine API)
* :mod:`qola.jit.libtable` the table a library records (ELF section .qola_jit): the authority on its units
* :mod:`qola.jit.schema`   shape checks of index.json and of that table (hostile input -> one QolaError)
* :mod:`qola.jit.safeio`   open only trusted regular files (no symlink/FIFO/device, bounded, owner/mode)
* :mod:`qola.jit.cache`    the cache on disk: checks, entries, temp files, locks, clean
* :mod:`qola.jit.prebuild` ``qola jit prebuild``: compile units ahead of time, runtime-compatible
* ``qola/runtime/jit/``    the C++17 runtime (libc + libdl): qola_jit.h, qola_jit_format.h, qola_jit*.cpp

Build engine integration (per module with deferred instances)::

    from qola.jit import key, layout
    cc = key.probe_compiler(toolchain.compiler, child_env)         # path + identity
    spec = layout.JitModuleSpec(module=md_name, lang="hip", arch="gfx942", compiler=cc,
                                flags=(*layout.shared_object_flags("hip", archs), *module_flags),
                                include_dirs=module_include_dirs, style="ck_fmha")
    out = layout.write_jit_module(spec, [(stem, path), ...], out_jit=OUT / "jit",
                                  stub_dir=build_dir / "jit" / md_name, batch=64)
    # compile into the library: out.stub_sources (like instances), out.table_source and
    # out.runtime_sources (host C++17), with -I out.include_dir plus OUT/include (qola_common.h,
    # qola_config.h); link -ldl. The library must sit in OUT/lib (it finds OUT/jit/<module> as
    # <libdir>/../jit/<module>).
"""
