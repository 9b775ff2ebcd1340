"""What each GPU figure rests on: bands for what is not measured, none for what is."""

import pytest

from servefleet.hardware import (
    BANDED_PARAMETERS,
    get_gpu,
    parameter_bands,
    parameter_value,
    with_parameters,
)


def test_h200_efficiency_is_measured_but_its_collectives_are_not():
    bands = parameter_bands(get_gpu("H200"))
    assert not any(name.startswith("efficiency.") for name in bands)
    assert "interconnect.latency_s" in bands


def test_v100_every_banded_figure_brackets_the_catalog_value():
    gpu = get_gpu("V100-SXM2-32G")
    bands = parameter_bands(gpu)
    assert set(bands) == set(BANDED_PARAMETERS)
    for name, band in bands.items():
        assert band.basis == ("derived" if name == "efficiency.weight_bw" else "assumed"), name
        assert band.low <= parameter_value(gpu, name) <= band.high, name


def test_derived_bands_are_narrower_than_assumed_ones():
    """H100: the H200's silicon; NVLink 4 collectives: cited micro-benchmarks."""
    h100, a100 = parameter_bands(get_gpu("H100")), parameter_bands(get_gpu("A100"))
    for name in ("efficiency.gemm_max", "interconnect.latency_s"):
        assert h100[name].basis == "derived" and a100[name].basis == "assumed"
        width = {
            k: (b[name].high - b[name].low) / b[name].high for k, b in (("h", h100), ("a", a100))
        }
        assert width["h"] < width["a"], name
    assert parameter_bands(get_gpu("H200"))["interconnect.latency_s"].basis == "derived"


def test_with_parameters_replaces_only_what_it_is_given():
    gpu = get_gpu("V100")
    other = with_parameters(gpu, {"interconnect.latency_s": 2e-5, "efficiency.gemm_max": 0.5})
    assert other.interconnect.latency_s == 2e-5
    assert other.efficiency.gemm_max == 0.5
    assert other.efficiency.attn_prefill == gpu.efficiency.attn_prefill
    with pytest.raises(ValueError, match="unknown parameter"):
        with_parameters(gpu, {"efficiency.nope": 1.0})
