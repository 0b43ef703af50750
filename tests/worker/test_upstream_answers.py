"""What an upstream server answers the ``--engine openai`` worker is checked before it is
used: ``/v1/models`` (its shape, ``max_model_len``) and ``/metrics`` (any text: figures
that are not finite counts, and labels that are not plain decimals, are refused or
ignored, never an exception out of ``parse``)."""

from __future__ import annotations

import re

import pytest

from dynamod.errors import ConfigError, InvalidInputError
from dynamod.worker.engines.scrape import MAX_FIGURE, Scraped, parse
from dynamod.worker.engines.upstream_answers import MAX_CONTEXT, served_context

URL = "http://127.0.0.1:8000"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


def models(**entry: object) -> dict[str, object]:
    return {"object": "list", "data": [{"id": "m", **entry}]}


def test_a_models_answer_gives_the_context_when_it_says_one() -> None:
    assert served_context(models(max_model_len=4096), "m", URL) == 4096
    assert served_context(models(), "m", URL) is None
    assert served_context(models(max_model_len=None), "m", URL) is None


@pytest.mark.parametrize("value", [True, False, 0, -1, 1.5, "4096", MAX_CONTEXT + 1, [1]])
def test_a_max_model_len_that_is_not_a_positive_integer_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match=r"says max_model_len .* for model 'm'; it must be"):
        served_context(models(max_model_len=value), "m", URL)


@pytest.mark.parametrize("body", [[{"id": "m"}], {"data": {"id": "m"}}, "m", None, {}])
def test_a_models_answer_of_another_shape_is_refused(body: object) -> None:
    with pytest.raises(ConfigError, match="not a JSON object with a 'data' list of models"):
        served_context(body, "m", URL)


def test_a_model_not_served_is_named_with_what_is() -> None:
    body = {"data": [{"id": "a"}, {"id": 7}, "junk", {"id": "b"}]}
    with pytest.raises(ConfigError, match="does not serve model 'm'; it serves: 'a', 'b'"):
        served_context(body, "m", URL)


@pytest.mark.parametrize(
    ("value", "shown"),
    [("NaN", "nan"), ("+Inf", "inf"), ("-Inf", "-inf"), ("-1", "-1.0"), ("1e300", "1e+300")],
)
def test_a_figure_that_is_not_a_sane_count_is_refused_by_name(value: str, shown: str) -> None:
    page = f"{RUNNING} {value}\n{WAITING} 0\n"
    with pytest.raises(InvalidInputError, match=re.escape(f"metric {RUNNING} is {shown}; a")):
        parse(page)


def test_odd_pages_are_refused_with_one_error_and_odd_labels_count_as_absent() -> None:
    with pytest.raises(InvalidInputError, match="the upstream's metrics do not parse"):
        parse(f'{RUNNING}{{a="x",a="y"}} 1\n{WAITING} 0\n')
    with pytest.raises(InvalidInputError, match="the upstream's metrics do not parse"):
        parse("\x00\x01")
    info = 'vllm:cache_config_info{block_size="²",num_gpu_blocks="99999999999999999999"} 1\n'
    assert parse(f"{info}{RUNNING} 1\n{WAITING} 0\n") == Scraped(kind="vllm", running=1)
    usage = f"{RUNNING} 1\n{WAITING} 0\nvllm:kv_cache_usage_perc 1.0000001\n"
    assert parse(usage).kv_usage == 1.0  # rounded past full is full
    assert MAX_FIGURE == 2**40
