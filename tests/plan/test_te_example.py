"""examples/te-manifest.toml is Transformer Engine's manifest (issue 40 item 4): the facts of TE's
``transformer_engine/common/ck_fused_attn/qola_manifest.toml`` at TE commit 1f682cfd, recorded here
in qola's terms, and examples/te-ckjit-manifest.toml is that manifest and a ``[jit]`` section, the
text included (a header comment aside), so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

from support.common import EXAMPLES

from qola.plan import manifest as mf

# TE 1f682cfd's qola_manifest.toml: its pin (a ROCm/aiter commit: csrc/cpp_itfs/mha_fwd.cu exists there),
# namespace, ROCm versions, archs, and two cpp_itfs modules by receipt 700; no variant matrix, no
# embed list (the registry's applies), no link kind (shared), no [jit].
TE_1F682CFD: dict[str, Any] = {
    "aiter_commit": "7a24cd87525834fa9aeaa021e6ee80ab7de028f9",
    "namespace": "te",
    "rocm_versions": ["7.2"],
    "architectures": {"gfx950", "gfx942"},
    "modules": {
        "libmha_fwd": {
            "mode": "cpp_itfs",
            "receipt": 700,
            "drop_srcs": ["mha_fwd_split.cu", "mha_fwd_batch_prefill.cu"],
            "drop_directions": ["fwd_splitkv", "batch_prefill"],
        },
        "libmha_bwd": {"mode": "cpp_itfs", "receipt": 700},
    },
}


def test_te_manifest_states_tes_facts_and_nothing_more() -> None:
    man = mf.load(EXAMPLES / "te-manifest.toml")
    assert man.qola.aiter_commit == TE_1F682CFD["aiter_commit"]
    assert (man.qola.namespace, man.qola.rocm_versions) == (TE_1F682CFD["namespace"], TE_1F682CFD["rocm_versions"])
    assert set(man.build.architectures) == TE_1F682CFD["architectures"]
    assert man.build.link == "shared" and man.build.mode in (None, "cpp_itfs")
    # every module key TE sets, as TE sets it; every other key left to qola (the registry's embed, ...)
    blank = mf.parse('[[modules]]\nname = "x"\n', "blank.toml").modules[0].model_dump(exclude={"name"})
    got = {m.name: m.model_dump(exclude={"name"}) for m in man.modules}
    assert got == {name: {**blank, **facts} for name, facts in TE_1F682CFD["modules"].items()}
    # TE declares no variant matrix: every receipt-700 kernel is built (a narrower build is the user's)
    assert (man.variants, man.mha_fwd_variants, man.mha_bwd_variants, man.jit, man.usage) == ([], [], [], None, None)
    head = (EXAMPLES / "te-manifest.toml").read_text().split("\n[qola]", 1)[0]
    assert "1f682cfd" in head and "QoLA's example" not in head  # says what it mirrors, truthfully


def test_te_ckjit_manifest_is_the_te_manifest_text_and_a_jit_section() -> None:
    te = (EXAMPLES / "te-manifest.toml").read_text()
    ck = (EXAMPLES / "te-ckjit-manifest.toml").read_text()
    body, jit = ck[ck.index("\n[qola]") :].split("\n[jit]\n", 1)
    assert body == te[te.index("\n[qola]") :].rstrip("\n") + "\n"
    assert jit.split("#")[0].strip() == 'modules = ["libmha_fwd", "libmha_bwd"]'
