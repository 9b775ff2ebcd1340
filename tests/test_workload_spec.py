"""Loading workloads: YAML, presets as bases, overrides, records, and the error messages."""

import textwrap

import pytest

from servefleet.workload import (
    WorkloadError,
    WorkloadSpec,
    build_source,
    describe_workload,
    fixed_workload,
    load_workload,
    presets,
)


def write(tmp_path, text, name="wl.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


FULL = """\
    name: demo
    arrival: {type: gamma, rate: 4, burstiness: 2}
    users: 100
    classes:
      chat:
        weight: 3
        prompt: {type: lognormal, mean: 400, sd: 300, max: 4000}
        output: {type: normal, mean: 200, sd: 50}
        system_prompt: {tokens: 500, share: 0.8, groups: 3}
        session: {turns: {type: uniform, min: 2, max: 6}, think_time_mean: 5}
      docs:
        prompt: {type: empirical, path: lengths.txt}
        output: 300
        arrival: {type: ramp, start_rate: 0.1, end_rate: 2, duration: 600}
"""


def test_full_yaml_loads_describes_and_round_trips(tmp_path):
    (tmp_path / "lengths.txt").write_text("1000\n3000\n")
    spec = load_workload(write(tmp_path, FULL))
    assert spec.classes["docs"].prompt.path == str((tmp_path / "lengths.txt").resolve())
    assert WorkloadSpec.model_validate(spec.model_dump()) == spec
    lines = describe_workload(spec).splitlines()
    assert len(lines) == 3 and lines[0].startswith("demo:")
    assert "chat" in lines[1] and "gamma" in lines[1] and "docs" in lines[2] and "ramp" in lines[2]
    reqs = list(zip(range(50), build_source(spec, seed=0).initial(), strict=False))
    assert reqs


def test_name_defaults_to_the_file_stem(tmp_path):
    path = write(
        tmp_path,
        "arrival: {type: poisson, rate: 1}\nclasses: {a: {prompt: 1, output: 1}}\n",
        "my mix.yaml",
    )
    assert load_workload(path).name == "my-mix"


def test_preset_as_base_with_overrides(tmp_path):
    path = write(
        tmp_path,
        """\
        base: enterprise-mix
        classes:
          summaries:
            arrival: {period: 300}
          sessions: null
        """,
    )
    spec = load_workload(path)
    assert spec.base == "enterprise-mix" and spec.name == "wl"
    assert spec.classes["summaries"].arrival.period == 300
    assert spec.classes["summaries"].arrival.count == presets.SUMMARY_BURST
    assert set(spec.classes) == {"qa", "summaries"}


def test_overrides_argument_and_type_change_replaces():
    spec = load_workload("chat-3tier", overrides={"arrival": {"type": "closed", "concurrency": 4}})
    assert spec.arrival.type == "closed" and spec.arrival.concurrency == 4
    spec = load_workload("chat-3tier", overrides={"arrival": {"rate": 3}})
    assert spec.arrival.rate == 3


def test_fixed_workload():
    spec = fixed_workload(512, 64)
    (cls,) = spec.classes.values()
    assert (cls.prompt.value, cls.output.value) == (512, 64)
    r = next(iter(build_source(spec, seed=0, rate=2.0).initial()))
    assert (r.prompt_tokens, r.max_tokens) == (512, 64)


def raises(tmp_path, text, *patterns):
    with pytest.raises(WorkloadError) as info:
        load_workload(write(tmp_path, text))
    for p in patterns:
        assert p in str(info.value), str(info.value)
    return str(info.value)


def test_malformed_yaml_names_file_and_line(tmp_path):
    raises(tmp_path, "classes:\n  a: {prompt: 1\n  b: 2\n", "wl.yaml:3", "invalid YAML")
    raises(tmp_path, "- just\n- a list\n", "wl.yaml", "mapping")


def test_unknown_field_suggests_the_spelling(tmp_path):
    msg = raises(
        tmp_path,
        "arrival: {type: poisson, rate: 1}\nclasses: {a: {promt: 5, prompt: 5, output: 5}}\n",
        "wl.yaml",
        "classes.a.promt",
        "did you mean 'prompt'",
    )
    assert "unknown field" in msg


def test_unknown_type_lists_the_choices(tmp_path):
    raises(
        tmp_path,
        "arrival: {type: poison, rate: 1}\nclasses: {a: {prompt: 5, output: 5}}\n",
        "arrival",
        "'poison'",
        "'poisson'",
    )


def test_bad_value_names_the_nested_field(tmp_path):
    raises(
        tmp_path,
        "arrival: {type: poisson, rate: 1}\nclasses: {a: {prompt: {type: normal, mean: 10, sd: -1}, output: 5}}\n",
        "classes.a.prompt.sd",
        "greater than or equal to 0",
    )


def test_missing_arrival_and_missing_lengths(tmp_path):
    raises(tmp_path, "classes: {a: {prompt: 5, output: 5}}\n", "no `arrival:`", "['a']")
    raises(
        tmp_path, "arrival: {type: poisson, rate: 1}\nclasses: {a: {prompt: 5}}\n", "missing output"
    )


def test_missing_dataset_file_names_the_file(tmp_path):
    msg = raises(
        tmp_path,
        "arrival: {type: poisson, rate: 1}\nclasses: {a: {dataset: {type: sharegpt, path: nope.json}}}\n",
        "classes.a.dataset.path",
        "file not found",
        "nope.json",
    )
    assert str(tmp_path) in msg


def test_unknown_workload_and_missing_sharegpt_path(tmp_path):
    with pytest.raises(WorkloadError, match="not a preset"):
        load_workload(tmp_path / "absent.yaml")
    with pytest.raises(WorkloadError, match="sharegpt:PATH"):
        load_workload("sharegpt")
    with pytest.raises(WorkloadError, match="base"):
        load_workload(write(tmp_path, "base: nope\n"))


def test_conflicting_system_prompt_pools(tmp_path):
    raises(
        tmp_path,
        """\
        arrival: {type: poisson, rate: 1}
        classes:
          a: {prompt: 5, output: 5, system_prompt: {tokens: 100}}
          b: {prompt: 5, output: 5, system_prompt: {tokens: 200}}
        """,
        "system_prompt.name",
    )


def test_errors_are_value_errors():
    assert issubclass(WorkloadError, ValueError)


def test_a_bench_summary_replays_the_workload_it_recorded_without_its_files():
    from servefleet.workload import fixed_workload, load_workload, recorded_workload

    for spec in (fixed_workload(128, 32), load_workload("enterprise-mix")):
        summary = {"workload": spec.model_dump(mode="json")}
        assert recorded_workload(summary) == spec
