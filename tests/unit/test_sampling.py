"""SamplingParams validation and the reference filters, on hand-built distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmrun.decoding.sampling import (
    DEFAULTS,
    SamplingParams,
    apply_penalties,
    filtered_distribution,
    merge_layers,
    min_p_filter,
    softmax,
    top_k_filter,
    top_p_filter,
)
from llmrun.errors import InvalidParameter


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("temperature", -0.1, ">= 0"),
        ("temperature", math.nan, "finite"),
        ("temperature", "hot", "a number"),
        ("top_k", -1, ">= 0"),
        ("top_k", 2.5, "an integer"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("min_p", -0.01, "[0, 1]"),
        ("repeat_penalty", 0.0, "> 0"),
        ("repeat_last_n", -2, ">= -1"),
        ("presence_penalty", 2.5, "[-2, 2]"),
        ("frequency_penalty", -3.0, "[-2, 2]"),
        ("seed", -1, "in [0,"),
        ("seed", True, "an integer"),
        ("max_tokens", 0, ">= 1"),
        ("stop", ("",), "non-empty"),
        ("stop", "END", "a list"),
    ],
)
def test_invalid_values_name_the_field_and_range(field: str, value: object, expected: str) -> None:
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert info.value.name == field
    assert expected in info.value.expected
    assert info.value.message.startswith(f"`{field}` must be")  # named as the field; each adapter words it
    assert info.value.worded({field: "--x"})[0].startswith("--x must be")


def test_valid_edges_are_accepted_and_normalised() -> None:
    params = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0, max_tokens=-1, seed=0, stop=["a"])  # type: ignore[arg-type]
    assert params.greedy
    assert isinstance(params.temperature, float)
    assert params.stop == ("a",)
    assert SamplingParams(temperature=0.0) == SamplingParams(temperature=0)


def test_merge_layers_records_sources_and_later_layers_win() -> None:
    params, sources = merge_layers(
        SamplingParams,
        [("models.toml", {"temperature": 0.2, "top_k": 5}), ("command line", {"top_k": 1, "seed": None})],
    )
    assert params.temperature == 0.2
    assert params.top_k == 1
    assert params.top_p == DEFAULTS.top_p
    assert sources["temperature"] == "models.toml"
    assert sources["top_k"] == "command line"
    assert sources["seed"] == "default"


def test_merge_layers_rejects_unknown_fields() -> None:
    with pytest.raises(TypeError):
        merge_layers(SamplingParams, [("x", {"temprature": 1})])


def test_softmax_sums_to_one_and_ignores_minus_inf() -> None:
    probs = softmax(np.array([1.0, 2.0, -np.inf, 3.0]))
    assert probs.sum() == pytest.approx(1.0)
    assert probs[2] == 0.0
    assert np.argmax(probs) == 3


def test_top_k_keeps_the_k_largest() -> None:
    probs = np.array([0.1, 0.4, 0.2, 0.3])
    assert np.nonzero(top_k_filter(probs, 2))[0].tolist() == [1, 3]
    assert np.array_equal(top_k_filter(probs, 0), probs)


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    assert np.nonzero(top_p_filter(probs, 0.8))[0].tolist() == [0, 1]
    assert np.nonzero(top_p_filter(probs, 0.81))[0].tolist() == [0, 1, 2]
    assert np.nonzero(top_p_filter(probs, 1e-9))[0].tolist() == [0]


def test_min_p_is_relative_to_the_top_token() -> None:
    probs = np.array([0.6, 0.3, 0.06, 0.04])
    assert np.nonzero(min_p_filter(probs, 0.1))[0].tolist() == [0, 1, 2]
    assert np.nonzero(min_p_filter(probs, 1.0))[0].tolist() == [0]


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = np.array([2.0, -2.0, 1.0])
    out = apply_penalties(logits, [0, 1], SamplingParams(repeat_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 1.0]
    assert apply_penalties(logits, [0, 1], SamplingParams(repeat_penalty=2.0, repeat_last_n=0)).tolist() == [
        2.0,
        -2.0,
        1.0,
    ]
    # only the last n tokens count
    assert apply_penalties(logits, [0, 1], SamplingParams(repeat_penalty=2.0, repeat_last_n=1))[0] == 2.0


def test_presence_and_frequency_penalties_subtract() -> None:
    logits = np.array([1.0, 1.0, 1.0])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, [0, 0, 1], params)
    assert out.tolist() == [1.0 - 0.5 - 0.5, 1.0 - 0.25 - 0.5, 1.0]


def test_greedy_distribution_is_one_hot() -> None:
    dist = filtered_distribution(np.array([0.1, 3.0, 2.9]), SamplingParams(temperature=0))
    assert dist.tolist() == [0.0, 1.0, 0.0]


def test_temperature_sharpens_and_flattens() -> None:
    logits = np.array([1.0, 2.0, 3.0])
    open_params = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    cold = filtered_distribution(logits, SamplingParams(temperature=0.5, **open_params))
    hot = filtered_distribution(logits, SamplingParams(temperature=2.0, **open_params))
    assert cold[2] > softmax(logits)[2] > hot[2]
    assert cold.sum() == pytest.approx(1.0) and hot.sum() == pytest.approx(1.0)


def test_run_seed_is_none_when_greedy_given_when_set_and_fresh_otherwise() -> None:
    assert SamplingParams(temperature=0, seed=5).run_seed() is None
    assert SamplingParams(seed=5).run_seed() == 5
    drawn = {SamplingParams().run_seed() for _ in range(8)}
    assert None not in drawn and len(drawn) > 1
