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


def test_v100_every_banded_figure_is_assumed_and_brackets_the_catalog_value():
    gpu = get_gpu("V100-SXM2-32G")
    bands = parameter_bands(gpu)
    assert set(bands) == set(BANDED_PARAMETERS)
    for name, band in bands.items():
        assert band.basis == "assumed"
        assert band.low <= parameter_value(gpu, name) <= band.high, name


def test_with_parameters_replaces_only_what_it_is_given():
    gpu = get_gpu("V100")
    other = with_parameters(gpu, {"interconnect.latency_s": 2e-5, "efficiency.gemm_max": 0.5})
    assert other.interconnect.latency_s == 2e-5
    assert other.efficiency.gemm_max == 0.5
    assert other.efficiency.attn_prefill == gpu.efficiency.attn_prefill
    with pytest.raises(ValueError, match="unknown parameter"):
        with_parameters(gpu, {"efficiency.nope": 1.0})
