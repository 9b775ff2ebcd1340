"""Length distributions and empirical files."""

import json

import numpy as np
import pytest

from servefleet.workload import WorkloadError
from servefleet.workload.datasets import load_lengths
from servefleet.workload.distributions import Empirical, Fixed, LogNormal, Normal, Uniform


def draws(d, n=20_000):
    rng = np.random.default_rng(3)
    return np.array([d.sample(rng) for _ in range(n)])


def test_fixed_and_uniform():
    assert set(draws(Fixed(7), 10)) == {7}
    x = draws(Uniform(10, 20))
    assert x.min() == 10 and x.max() == 20
    assert x.mean() == pytest.approx(Uniform(10, 20).mean(), rel=0.01)


def test_normal_is_clipped_and_at_least_one():
    x = draws(Normal(50, 100, 1, 120))
    assert x.min() == 1 and x.max() == 120
    x = draws(Normal(1842, 632))
    assert x.mean() == pytest.approx(1842, rel=0.02)
    assert x.std() == pytest.approx(632, rel=0.03)
    assert Normal(50, 100, 1, 120).mean() == pytest.approx(
        draws(Normal(50, 100, 1, 120)).mean(), rel=0.03
    )


def test_lognormal_has_the_given_mean_and_sd():
    x = draws(LogNormal(300, 200), 50_000)
    assert x.mean() == pytest.approx(300, rel=0.03)
    assert x.std() == pytest.approx(200, rel=0.1)
    assert x.min() >= 1


def test_empirical_from_lines_and_json(tmp_path):
    lines = tmp_path / "lengths.txt"
    lines.write_text("# observed\n10\n\n20\n30  # trailing comment\n")
    values = load_lengths(lines)
    assert list(values) == [10, 20, 30]
    x = draws(Empirical(values), 3000)
    assert set(x) == {10, 20, 30}
    assert x.mean() == pytest.approx(20, rel=0.05)
    js = tmp_path / "lengths.json"
    js.write_text(json.dumps([5, 5, 9]))
    assert list(load_lengths(js)) == [5, 5, 9]


def test_empirical_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(WorkloadError, match=r"missing\.txt"):
        load_lengths(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("10\nabc\n")
    with pytest.raises(WorkloadError, match=r"bad\.txt:2: length must be an integer >= 1"):
        load_lengths(bad)
    zero = tmp_path / "zero.json"
    zero.write_text("[3, 0]")
    with pytest.raises(WorkloadError, match="item 1"):
        load_lengths(zero)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(WorkloadError, match="no lengths"):
        load_lengths(empty)
