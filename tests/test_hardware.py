"""GPU catalog: datasheet numbers, lookups, efficiency defaults, user YAML."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from servefleet.hardware import (
    EFFICIENCY_DEFAULTS,
    GPUCatalog,
    GPUFileError,
    GPUSpec,
    UnknownGPUError,
    default_efficiency,
)

REQUIRED = [
    "V100-PCIE-32G",
    "V100-SXM2-32G",
    "V100-16G",
    "T4",
    "A10",
    "A100-40G-SXM",
    "A100-80G-SXM",
    "L40S",
    "RTX-4090",
    "H100-SXM",
    "H200-SXM",
]

USER_GPU = """
- name: RTX-3090
  aliases: [rtx3090, geforce-rtx-3090]
  memory_bytes: 25438126080
  hbm_bandwidth: 936e9
  flops: {fp16: 71e12, bf16: 71e12}
  compute_capability: [8, 6]
  interconnect: {kind: pcie, bandwidth: 31.5e9, latency_s: 3.0e-5, description: PCIe 4.0 x16}
  attention_backend: FLASH_ATTN
  datasheet: NVIDIA Ampere GA102 whitepaper
  efficiency: {gemm_max: 0.6}
"""


@pytest.fixture(scope="module")
def catalog() -> GPUCatalog:
    return GPUCatalog.builtin()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    return path


def test_catalog_has_required_gpus(catalog: GPUCatalog) -> None:
    assert set(REQUIRED) <= set(catalog.names())
    assert len(catalog) == len(list(catalog))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v100", "V100-SXM2-32G"),
        ("V100-32G", "V100-SXM2-32G"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32G"),
        ("Tesla V100-PCIE-32GB", "V100-PCIE-32G"),
        ("Tesla V100-SXM2-16GB", "V100-16G"),
        ("NVIDIA H200", "H200-SXM"),
        ("h200-sxm", "H200-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-80G-SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100-40G-SXM"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("Tesla T4", "T4"),
        ("NVIDIA L40S", "L40S"),
        ("nvidia_a10", "A10"),
    ],
)
def test_lookup_by_alias_and_nvidia_smi_name(catalog: GPUCatalog, name: str, expected: str) -> None:
    assert catalog.get(name).name == expected
    assert name in catalog


def test_unknown_gpu_lists_names_and_closest_match(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownGPUError) as info:
        catalog.get("H20O")
    message = str(info.value)
    assert "Did you mean 'H200-SXM'" in message
    for name in REQUIRED:
        assert name in message
    assert isinstance(info.value, ValueError)
    assert "nonsense" not in catalog


def test_v100_has_no_bf16(catalog: GPUCatalog) -> None:
    v100 = catalog.get("v100")
    assert v100.bf16 is False
    assert v100.compute_capability == (7, 0)
    assert v100.peak_flops("fp16") == pytest.approx(125e12)
    assert v100.peak_flops("float16") == pytest.approx(125e12)
    with pytest.raises(ValueError, match=r"no bf16 tensor support; supported dtypes: fp16$"):
        v100.peak_flops("bf16")
    with pytest.raises(ValueError, match="bfloat16"):
        v100.peak_flops("bfloat16")


@pytest.mark.parametrize(
    ("name", "fp16_tflops", "bw_gbs", "mib"),
    [
        ("V100-SXM2-32G", 125, 900, 32510.5),
        ("V100-PCIE-32G", 112, 900, 32510.5),
        ("V100-16G", 125, 900, 16160.5),
        ("T4", 65, 320, 15095),
        ("A100-80G-SXM", 312, 2039, 81251),
        ("H100-SXM", 989.4, 3350, 81090),
        ("H200-SXM", 989.4, 4800, 143155.9375),
    ],
)
def test_datasheet_numbers(
    catalog: GPUCatalog, name: str, fp16_tflops: float, bw_gbs: float, mib: float
) -> None:
    gpu = catalog.get(name)
    assert gpu.peak_flops("fp16") == pytest.approx(fp16_tflops * 1e12)
    assert gpu.hbm_bandwidth == pytest.approx(bw_gbs * 1e9)
    assert gpu.memory_bytes / 2**20 == pytest.approx(mib)


def test_memory_is_what_cuda_reports_not_marketing(catalog: GPUCatalog) -> None:
    assert catalog.get("v100").memory_bytes == 34_089_730_048
    assert catalog.get("h200").memory_bytes == 150_109_880_320  # measured; nvidia-smi: 143771 MiB
    for gpu in catalog:
        assert isinstance(gpu.memory_bytes, int)
        assert 14 * 2**30 < gpu.memory_bytes < 141 * 2**30


def test_dense_not_sparse_and_dtype_support(catalog: GPUCatalog) -> None:
    h100 = catalog.get("h100")
    assert h100.peak_flops("bf16") < 1000e12  # 1979 is the sparse figure
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=1e-3)
    assert "fp8" not in catalog.get("A100-80G-SXM").flops
    t4 = catalog.get("t4")
    assert t4.supported_dtypes == ("fp16", "int8")
    assert t4.peak_flops("int8") == pytest.approx(130e12)
    assert "int8" not in catalog.get("V100-SXM2-32G").flops


def test_interconnects(catalog: GPUCatalog) -> None:
    sxm2 = catalog.get("V100-SXM2-32G").interconnect
    assert sxm2.kind == "nvlink"
    assert sxm2.bandwidth == pytest.approx(100e9)  # 4 of its 6 NVLink 2 links reach its quad
    assert sxm2.custom_allreduce_max_tp == 4  # a hybrid cube-mesh links 4 GPUs, not 8
    pcie = catalog.get("V100-PCIE-32G").interconnect
    assert pcie.kind == "pcie"
    assert pcie.bandwidth == pytest.approx(15.75e9)
    assert pcie.allreduce_bandwidth < pcie.bandwidth
    assert catalog.get("A100-80G-SXM").interconnect.bandwidth == pytest.approx(300e9)
    assert catalog.get("H200-SXM").interconnect.bandwidth == pytest.approx(450e9)
    assert catalog.get("L40S").interconnect.kind == "pcie"


def test_attention_backend_and_efficiency_defaults(catalog: GPUCatalog) -> None:
    for gpu in catalog:
        expected = "FLASH_ATTN" if gpu.compute_capability >= (8, 0) else "TRITON_ATTN"
        assert gpu.attention_backend == expected
        if gpu.name == "H200-SXM":
            assert gpu.efficiency.source.startswith("measured")
        else:
            assert gpu.efficiency == default_efficiency(expected)
            assert gpu.efficiency.source.startswith(("assumed", "scaled"))
    flash, triton = default_efficiency("FLASH_ATTN"), default_efficiency("triton_attn")
    assert triton.attn_prefill < flash.attn_prefill
    assert triton.attn_decode_bw < flash.attn_decode_bw
    assert triton.gemm_max < flash.gemm_max
    assert set(EFFICIENCY_DEFAULTS) == {"FLASH_ATTN", "TRITON_ATTN"}
    with pytest.raises(ValueError, match="unknown attention_backend"):
        default_efficiency("PAGED_MAGIC")


def test_gemm_efficiency_curve() -> None:
    eff = default_efficiency("FLASH_ATTN")
    assert eff.gemm(eff.gemm_half_tokens) == pytest.approx(eff.gemm_max / 2)
    assert eff.gemm(0) == 0.0
    assert eff.gemm(1e9) == pytest.approx(eff.gemm_max, rel=1e-6)


def test_specs_are_immutable_and_hashable(catalog: GPUCatalog) -> None:
    gpu = catalog.get("h200")
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.memory_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        gpu.flops["fp16"] = 1.0  # type: ignore[index]
    assert {gpu: 1}[gpu] == 1
    assert GPUCatalog.builtin() is catalog
    tuned = gpu.with_efficiency(dataclasses.replace(gpu.efficiency, gemm_max=0.8, source="test"))
    assert tuned.efficiency.gemm_max == 0.8
    assert catalog.get("h200").efficiency.gemm_max != 0.8


def test_spec_rejects_inconsistent_bf16() -> None:
    base = GPUCatalog.builtin().get("v100")
    with pytest.raises(ValueError, match="bf16=True disagrees"):
        dataclasses.replace(base, bf16=True)
    with pytest.raises(ValueError, match="flops keys"):
        dataclasses.replace(base, flops={"fp4": 1e15})


def test_user_yaml_adds_gpu(tmp_path: Path, catalog: GPUCatalog) -> None:
    extended = catalog.with_yaml(write(tmp_path, USER_GPU))
    gpu = extended.get("GeForce RTX 3090")
    assert isinstance(gpu, GPUSpec)
    assert gpu.name == "RTX-3090"
    assert gpu.hbm_bandwidth == pytest.approx(936e9)
    assert gpu.bf16 is True  # derived from the flops table
    assert gpu.interconnect.latency_s == pytest.approx(3e-5)
    assert gpu.efficiency.gemm_max == 0.6
    assert gpu.efficiency.attn_prefill == default_efficiency("FLASH_ATTN").attn_prefill
    assert "gpus.yaml" in gpu.efficiency.source
    assert "RTX-3090" not in catalog.names()  # the builtin catalog is unchanged
    assert len(extended) == len(catalog) + 1


def test_user_yaml_gpus_key_and_default_efficiency(tmp_path: Path, catalog: GPUCatalog) -> None:
    text = "gpus:\n" + "\n".join("  " + line for line in USER_GPU.splitlines())
    text = text.replace("  efficiency: {gemm_max: 0.6}", "").replace("FLASH_ATTN", "TRITON_ATTN")
    gpu = catalog.with_yaml(write(tmp_path, text)).get("rtx3090")
    assert gpu.efficiency == default_efficiency("TRITON_ATTN")


def test_user_yaml_replaces_builtin_of_same_name(tmp_path: Path, catalog: GPUCatalog) -> None:
    text = USER_GPU.replace("name: RTX-3090", "name: h200-sxm").replace(
        "aliases: [rtx3090, geforce-rtx-3090]", "aliases: []"
    )
    extended = catalog.with_yaml(write(tmp_path, text))
    assert extended.get("H200-SXM").hbm_bandwidth == pytest.approx(936e9)
    assert len(extended) == len(catalog)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("hbm_bandwidth: 936e9", "hbm_bandwidth: fast"), r"gpus\[0\]\.hbm_bandwidth"),
        (("memory_bytes: 25438126080", "memory_bytes: -1"), r"gpus\[0\]\.memory_bytes"),
        (("kind: pcie", "kind: infiniband"), r"gpus\[0\]\.interconnect\.kind"),
        (("fp16: 71e12", "fp4: 71e12"), r"gpus\[0\]\.flops"),
        (("datasheet:", "data_sheet:"), r"gpus\[0\]\.data_sheet"),
        (("{gemm_max: 0.6}", "{gemm_max: 1.5}"), r"gpus\[0\]\.efficiency\.gemm_max"),
        (("attention_backend: FLASH_ATTN", "attention_backend: MAGIC"), "attention_backend"),
        (("  compute_capability: [8, 6]\n", ""), r"gpus\[0\]\.compute_capability"),
    ],
)
def test_malformed_yaml_names_file_and_field(
    tmp_path: Path, catalog: GPUCatalog, change: tuple[str, str], field: str
) -> None:
    old, new = change
    assert old in USER_GPU
    path = write(tmp_path, USER_GPU.replace(old, new))
    with pytest.raises(GPUFileError, match=field) as info:
        catalog.with_yaml(path)
    assert str(path) in str(info.value)


def test_yaml_alias_clash_with_builtin(tmp_path: Path, catalog: GPUCatalog) -> None:
    path = write(tmp_path, USER_GPU.replace("rtx3090, geforce-rtx-3090", "v100"))
    with pytest.raises(GPUFileError, match="'v100' of RTX-3090 is taken by V100-SXM2-32G"):
        catalog.with_yaml(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "is empty"),
        ("gpus: [\n", "not valid YAML"),
        (USER_GPU + USER_GPU, "appears twice"),
        ("just a string", "<top>"),
    ],
)
def test_bad_yaml_files(tmp_path: Path, catalog: GPUCatalog, text: str, match: str) -> None:
    with pytest.raises(GPUFileError, match=match):
        catalog.with_yaml(write(tmp_path, text))


def test_missing_yaml_file(tmp_path: Path, catalog: GPUCatalog) -> None:
    with pytest.raises(GPUFileError, match="cannot read GPU file"):
        catalog.with_yaml(tmp_path / "absent.yaml")


def test_allreduce_reproduces_the_cited_micro_benchmarks(catalog: GPUCatalog) -> None:
    """NVLink 4 (docs/hardware.md, "All-reduce"): vLLM's one-shot custom all-reduce on 4 H100s
    took 10/14/23/38 us for 0.5/1/2/4 MiB (vLLM PR #24532; one-shot wherever vLLM would use
    it); SGLang's one-shot kernel 3.7-4.8 us for small messages at TP 2-4 (SGLang PR #2904)."""
    link = catalog.get("H200-SXM").interconnect
    mib = 1 << 20
    oneshot = dataclasses.replace(link, latency_s=4.0e-6)
    sizes_us = {0.5: 10, 1: 14, 2: 23, 4: 38}
    for size, us in sizes_us.items():
        t = (
            oneshot.latency_s
            + oneshot.latency_per_rank_s * 2
            + 3 * size * mib / link.allreduce_bandwidth
        )
        assert t == pytest.approx(us * 1e-6, rel=0.2), size
    assert link.allreduce_time(4096, 2) == pytest.approx(4.0e-6, rel=0.05)
    assert link.allreduce_time(4096, 4) == pytest.approx(4.6e-6, rel=0.05)
    assert link.allreduce_time(mib, 8) > link.twoshot_latency_s  # two-shot above 256 KiB
    assert link.allreduce_time(mib, 1) == 0.0
