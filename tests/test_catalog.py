"""The packaged GPU and model catalogs carry the reference figures, with sources."""

from __future__ import annotations

import pytest

from boute.catalog import builtin_catalog

# ../shared/reference/hardware.md: dense BF16/FP16 TFLOPS, memory GB, bandwidth GB/s
HARDWARE_MD = {
    "h200-sxm": (989, 141, 4800),
    "h100-sxm": (989, 80, 3350),
    "h100-pcie": (756, 80, 2000),
    "a100-80gb": (312, 80, 2039),
    "a100-40gb": (312, 40, 1555),
    "l40s": (362, 48, 864),
    "l40": (181, 48, 864),
    "rtx-a6000": (155, 48, 768),
    "a40": (150, 48, 696),
    "l4": (121, 24, 300),
    "t4": (65, 16, 320),
    "rtx-4090": (165, 24, 1008),
    "rtx-3090": (71, 24, 936),
}
NO_FP8 = {"a100-80gb", "a100-80gb-pcie", "a100-40gb", "rtx-a6000", "a40", "rtx-3090", "t4"}  # Ampere, Turing
RUNPOD_MAR_2026 = {"h200-sxm": 3.59, "h100-sxm": 2.69, "h100-pcie": 1.99, "a100-80gb": 1.39, "l40s": 0.79,
                   "l40": 0.69, "l4": 0.44, "rtx-4090": 0.34, "rtx-3090": 0.22, "b200": 5.98}  # fmt: skip


def test_all_reference_gpus_with_figures_and_sources() -> None:
    cat = builtin_catalog()
    assert set(HARDWARE_MD) | {"rtx-5090", "rtx-pro-6000"} <= set(cat.gpus)
    for name, (tflops, mem, bw) in HARDWARE_MD.items():
        g = cat.gpu(name)
        assert (g.tflops_bf16, g.memory_gb, g.bandwidth_gbs) == pytest.approx((tflops, mem, bw), rel=0.01), name
    for g in cat.gpus.values():
        for fld in ("tflops_bf16", "memory_gb", "bandwidth_gbs", "link_gbs", "price_per_hour", "efficiency"):
            assert g.sources.get(fld), f"{g.name}: no source for {fld}"
        assert (g.tflops_fp8 is None) == (g.name in NO_FP8), g.name
        if g.tflops_fp8 is not None:
            assert g.tflops_fp8 == pytest.approx(2 * g.tflops_bf16, rel=0.02)
        assert 0 < g.efficiency.compute <= 1 and 0 < g.efficiency.bandwidth <= 1


def test_prices_prefer_runpod_then_paper() -> None:
    cat = builtin_catalog()
    for name, price in RUNPOD_MAR_2026.items():
        assert cat.gpu(name).price_per_hour == price
        assert "RunPod" in cat.gpu(name).sources["price_per_hour"]
    assert cat.gpu("rtx-5090").price_per_hour == 0.89
    assert cat.gpu("rtx-pro-6000").price_per_hour == 1.84


def test_blackwell_figures() -> None:
    cat = builtin_catalog()
    pro, g5090 = cat.gpu("rtx-pro-6000"), cat.gpu("rtx-5090")
    assert (pro.memory_gb, pro.bandwidth_gbs, pro.link) == (96, 1792, "pcie5")
    assert (g5090.memory_gb, g5090.bandwidth_gbs) == (32, 1792)
    assert "nvidia" in pro.sources["tflops_bf16"].lower()
    # the B200 of NVIDIA's DGX B200 (the TensorRT-LLM tables' "B200 180GB"): HGX figures at 1,000 W
    b200 = cat.gpu("b200")
    assert (b200.memory_gb, b200.bandwidth_gbs, b200.link, b200.link_gbs) == (180, 8000, "nvlink5", 900)
    assert (b200.tflops_bf16, b200.tflops_fp8, b200.tflops_fp4) == (2250, 4500, 9000)
    assert {b200.arch, pro.arch, g5090.arch} == {"blackwell"}


# models.md: BF16 KV bytes per token
KV_KIB = {"llama-3.1-8b": 128, "llama-3.1-70b": 320, "llama-3.2-1b": 32, "llama-3.2-3b": 112, "qwen2.5-7b": 56,
          "qwen2.5-14b": 192, "qwen2.5-32b": 256, "qwen2.5-72b": 320, "mistral-7b": 128, "mixtral-8x7b": 128}  # fmt: skip


def test_models_match_models_md() -> None:
    cat = builtin_catalog()
    for name, kib in KV_KIB.items():
        assert cat.model(name).kv_bytes_per_token() == kib * 1024, name
    mix = cat.model("mixtral-8x7b")
    assert mix.is_moe and mix.compute_params_b == 12.9 and mix.params_b == 46.7
    l7, l70 = cat.model("llama-7b"), cat.model("llama-2-70b")
    assert (l7.kv_heads, l7.ffn, l7.vocab, l7.params_b) == (32, 11008, 32000, 6.74)
    assert (l70.layers, l70.kv_heads, l70.vocab, l70.params_b) == (80, 8, 32000, 69.0)


def test_routerbench_open_models_have_sourced_shapes() -> None:
    """Every open model of ../shared/data/routerbench has a catalog entry whose params match its shapes."""
    from boute.catalog import builtin_catalog

    cat = builtin_catalog()
    for name in ("mistral-7b-v0.2", "wizardlm-13b", "codellama-34b", "yi-34b", "mixtral-8x7b", "llama-2-70b"):
        m = cat.model(name)
        assert m.sources.get("all") and m.hf_id
        dense = 2 * m.hidden * m.heads * m.head_dim + 2 * m.hidden * m.kv_heads * m.head_dim
        per_layer = dense + 3 * m.hidden * m.ffn * m.num_experts
        est = (m.vocab * m.hidden * (1 if m.tied_embeddings else 2) + m.layers * per_layer) / 1e9
        assert abs(est - m.params_b) / m.params_b < 0.01, (name, est, m.params_b)
