"""Typed records of the GPU and model catalogs.

Every figure is an input with a source, not a truth: the performance model multiplies datasheet peaks by
efficiency factors that a calibration file can override (see :mod:`boute.perf.calibration`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator


class Efficiency(BaseModel):
    """Share of datasheet peak that real serving kernels reach on a GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: float = Field(0.6, gt=0, le=1, description="achieved / peak dense BF16 FLOPs in prefill")
    compute_fp8: float | None = Field(
        None,
        gt=0,
        le=1,
        description="achieved / peak dense FP8 FLOPs; FP8 kernels reach a smaller share of their doubled peak "
        "(attention and norms stay 16-bit). None: same as `compute`",
    )
    compute_fp4: float | None = Field(
        None,
        gt=0,
        le=1,
        description="achieved / peak dense FP4 FLOPs (Blackwell NVFP4 GEMMs). None: same as `compute_fp8`",
    )
    bandwidth: float = Field(0.6, gt=0, le=1, description="achieved / peak memory bandwidth in decode")
    link: float = Field(0.7, gt=0, le=1, description="achieved / peak inter-GPU link bandwidth")
    step_overhead_ms: float = Field(
        1.0, ge=0, description="fixed per-iteration cost (scheduler, kernel launches) of one forward pass"
    )
    gemm_half_tokens: float | None = Field(
        None,
        ge=0,
        description="tokens per step at which GEMMs reach half their large-batch efficiency (tensor-core tile "
        "under-use). None: the value fitted on published GPU rows; 0 for engines without tiles (CPU SIMD)",
    )

    def compute_for(self, dtype: str) -> float:
        """The compute share that applies to GEMMs in ``dtype`` (FP4 falls back to FP8, FP8 to BF16)."""
        if dtype == "fp4" and self.compute_fp4 is not None:
            return self.compute_fp4
        if dtype in ("fp8", "fp4") and self.compute_fp8 is not None:
            return self.compute_fp8
        return self.compute


class GPUSpec(BaseModel):
    """One GPU type as the cost and performance models see it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    display_name: str = ""
    tflops_bf16: PositiveFloat = Field(description="dense BF16/FP16 TFLOPS (no sparsity)")
    tflops_fp8: PositiveFloat | None = Field(None, description="dense FP8 TFLOPS; None if unsupported")
    tflops_fp4: PositiveFloat | None = Field(None, description="dense FP4 TFLOPS (Blackwell); None if unsupported")
    memory_gb: PositiveFloat
    bandwidth_gbs: PositiveFloat = Field(description="peak memory bandwidth, GB/s")
    link: str = Field("pcie4", description="intra-node interconnect kind, e.g. nvlink4, pcie4")
    link_gbs: PositiveFloat = Field(description="peak per-direction per-GPU link bandwidth, GB/s")
    gpus_per_node: PositiveInt = 8
    arch: str | None = Field(
        None,
        description="architecture family (ampere, ada, hopper, blackwell): which fitted compute efficiency applies",
    )
    memory_type: str | None = Field(
        None,
        description="memory technology (hbm2e, hbm3, hbm3e, gddr6, gddr6x, gddr7): which bandwidth efficiency applies",
    )
    price_per_hour: float = Field(ge=0, description="USD per GPU-hour")
    efficiency: Efficiency = Efficiency()
    sources: dict[str, str] = Field(default_factory=dict, description="field -> where the figure comes from")


class ModelSpec(BaseModel):
    """One model architecture (from its public config.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    hf_id: str = ""
    params_b: PositiveFloat = Field(description="total parameters, billions (memory)")
    active_params_b: PositiveFloat | None = Field(None, description="parameters used per token (MoE compute)")
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    ffn: PositiveInt
    vocab: PositiveInt
    tied_embeddings: bool = False
    num_experts: PositiveInt = 1
    experts_per_token: PositiveInt = 1
    max_context: PositiveInt = 131072
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.active_params_b is not None and self.active_params_b > self.params_b:
            raise ValueError("active_params_b cannot exceed params_b")
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token cannot exceed num_experts")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def compute_params_b(self) -> float:
        """Parameters touched per token: all of them for dense models, the active ones for MoE."""
        return self.active_params_b if self.active_params_b is not None else self.params_b

    def kv_bytes_per_token(self, dtype_bytes: float = 2.0) -> float:
        """K and V for every layer: 2 * layers * kv_heads * head_dim * bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * dtype_bytes
