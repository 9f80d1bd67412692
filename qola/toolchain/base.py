"""The :class:`Toolchain` value: a found compiler and how to drive it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DISCARD_LOCALS = "-Wl,--discard-all"  # see Toolchain.discard_locals


@dataclass(frozen=True)
class ToolchainChoice:
    """What a build chooses of its toolchain beyond the search: ``compiler`` overrides the search;
    ``assume_version`` (HIP only) plans with AITER's flags for that version without probing
    (``--dry-run``); ``drop_hip_flags`` (HIP only): entries of AITER's flag set left out
    (``[build] drop_hip_flags``)."""

    compiler: str | None = None
    assume_version: str | None = None
    drop_hip_flags: Sequence[str] = ()


NO_CHOICE = ToolchainChoice()  # the search decides everything


@dataclass(frozen=True)
class VersionCheck:
    """``[qola] rocm_versions`` checked against the compiler found, recorded (manifest.json's
    ``version_check``, the recipe's toolchain), never enforced: ``message`` says why it does not
    match (None: it does)."""

    key: str  # the manifest key checked: "rocm_versions"
    accepted: tuple[str, ...]
    found: Mapping[str, str | None]  # {"hip": "6.4.43484", "rocm_release": "6.4.1" or None}
    status: str  # "match" | "mismatch"
    message: str | None = None

    def to_json(self) -> dict[str, object]:
        """Its JSON form (``message`` only on a mismatch); :meth:`of` reverses it."""
        data: dict[str, object] = {
            "key": self.key,
            "accepted": list(self.accepted),
            "found": dict(self.found),
            "status": self.status,
        }
        return data if self.message is None else {**data, "message": self.message}

    @classmethod
    def of(cls, data: Mapping[str, object]) -> VersionCheck:
        """From :meth:`to_json`'s form; TypeError or KeyError for anything else."""
        accepted, found, message = data["accepted"], data["found"], data.get("message")
        if not isinstance(accepted, list) or not isinstance(found, Mapping):
            raise TypeError("not a version check")
        if message is not None and not isinstance(message, str):
            raise TypeError("not a version check")
        return cls(
            str(data["key"]),
            tuple(str(a) for a in accepted),
            {str(k): None if v is None else str(v) for k, v in found.items()},
            str(data["status"]),
            message,
        )


@dataclass(frozen=True)
class Toolchain:
    """A device compiler, its identity, and the argv it takes.

    Build argv only through the methods; nothing here touches the file system or
    spawns processes. Child processes must run with ``child_env`` added to the
    caller's environment (HIP_PLATFORM=amd for hipcc); it is never set in qola's
    own process.
    """

    kind: str  # "hip" | "cuda"
    compiler: str  # absolute path of hipcc / amdclang++ / nvcc
    version: str  # HIP "5.2.21153" (hipcc --version), CUDA "13.0"
    version_output: str  # full `--version` output (part of the identity)
    identity: str  # sha256 hex of path + version_output
    archs: tuple[str, ...]
    host_cxx: str  # host C++ compiler: plain host code and every link
    child_env: dict[str, str] = field(hash=False)
    root: str = ""  # ROCm / CUDA install root
    base_flags: tuple[str, ...] = ()  # what device_flags() returns
    lang_args: tuple[str, ...] = ()  # put right before the source: -x hip / -x cu
    host_only: tuple[str, ...] = ()  # CUDA: in lang_args' place for a unit without device code (cuda.host_only)
    link_flags: tuple[str, ...] = ()  # runtime libraries for shared_link_argv
    libs: tuple[str, ...] = ()  # what consumers link (runtime_link_libs)
    lib_dirs: tuple[str, ...] = ()  # where those live
    dropped_flags: tuple[str, ...] = ()  # optional flags the probes found unsupported
    removed_flags: tuple[str, ...] = ()  # flags of the vendor set the manifest left out ([build] drop_hip_flags)
    rocm_version: str | None = None  # ROCm release from <root>/.info/version, when known
    host_wrap: tuple[str, ...] = ()  # what passes the next flag to the host compiler (nvcc: -Xcompiler)
    unit_flags: tuple[str, ...] = ()  # a source's stable identity, templates of {name} and {uid}
    discard_locals: bool = False  # links and archives drop local symbols (nvcc's pid-named temporaries)
    # [qola] rocm_versions checked without enforcing it (None: not asked)
    version_check: VersionCheck | None = field(default=None, hash=False, compare=False)
    found_by: str = ""  # how the compiler was found ("$ROCM_PATH/bin/hipcc (ROCM_PATH)", "hipcc on PATH", …)

    def device_flags(self) -> list[str]:
        """Base flags for every device-compiled source (.cu, .hip and .cpp alike)."""
        return list(self.base_flags)

    def prefix_map_flags(self, maps: Sequence[tuple[str, str]]) -> list[str]:
        """``-ffile-prefix-map=OLD=NEW`` for each pair (``__FILE__``, debug info), through the host
        compiler's wrapper where the driver needs one (nvcc preprocesses both sides with it)."""
        return [tok for old, new in maps for tok in (*self.host_wrap, f"-ffile-prefix-map={old}={new}")]

    def unit_flags_for(self, name: str, uid: str) -> list[str]:
        """Flags naming one source by ``name`` (its path with the roots mapped,
        :class:`qola.compile.pathmap.PathMap`) and ``uid`` (:func:`qola.compile.pathmap.unit_id`) instead of its
        real path, from which nvcc derives its module id and clang its HIP CUID."""
        return [f.format(name=name, uid=uid) for f in self.unit_flags]

    def compile_argv(
        self,
        src: str | os.PathLike[str],
        obj: str | os.PathLike[str],
        flags: list[str],
    ) -> list[str]:
        """Compile one source to ``obj`` and write a Makefile depfile beside it.

        ``flags`` is the whole flag list, normally ``device_flags()`` + include
        flags + the module's own flags; nothing is added except ``-MD`` and the
        language switch that makes .cpp compile as device code.

        ``-MD`` alone: the compiler names the depfile after ``-o``
        (:func:`qola.toolchain.portable.depfile_of`), so the line names no file of the build dir
        but its source and object and replays from anywhere (a client such as ck-jit records its
        flags and runs them later, after the build dir is gone: :mod:`qola.toolchain.portable`).

        The line keeps the shape of AITER's own (torch's cpp_extension): no option whose value a
        compiler wrapper could take for the source. ck-jit's interceptor takes the first argument
        that is not a flag and follows no flag it knows to take a value (``-o -x -I -D -U
        -include -isystem --offload-arch --amdgpu-target -MF -arch -ccbin --compiler-bindir
        -Xcompiler -Xlinker``) as the source; ``-MT obj`` made the object "the source". The
        depfile's target is the ``-o`` path without it (clang, gcc and nvcc alike).
        """
        obj = os.fspath(obj)
        return [
            self.compiler,
            *flags,
            "-MD",
            *self.lang_args,
            "-c",
            os.fspath(src),
            "-o",
            obj,
        ]

    def shared_link_argv(
        self, objs_rsp: str | os.PathLike[str], out: str | os.PathLike[str], ldflags: list[str]
    ) -> list[str]:
        """Link a shared library with the host C++ compiler from a response file of
        objects (nvcc does not read @files; c++ does), then the GPU runtime:
        static cudart for CUDA (the .so then needs no CUDA toolkit to load),
        libamdhip64 for HIP. The command is :func:`qola.compile.link.shared_link_argv`'s."""
        from qola.compile.link import shared_link_argv  # lazy: this module stays free of the link machinery

        discard = [DISCARD_LOCALS] if self.discard_locals else []
        return shared_link_argv(self.host_cxx, objs_rsp, out, ldflags, (*self.link_flags, *discard))

    def runtime_link_libs(self) -> list[str]:
        """Libraries a consumer of a static archive must link (CMake / pkg-config)."""
        return list(self.libs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (tuples become lists); ``from_dict`` reverses it."""
        data = asdict(self)
        data["version_check"] = None if self.version_check is None else self.version_check.to_json()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Toolchain:
        values = dict(data)
        for key, spec in cls.__dataclass_fields__.items():
            if key in values and isinstance(values[key], list) and "tuple" in str(spec.type):
                values[key] = tuple(values[key])
        values["child_env"] = dict(values.get("child_env") or {})
        check = values.get("version_check")
        values["version_check"] = None if check is None else VersionCheck.of(check)
        return cls(**values)
