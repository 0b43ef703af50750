"""The ``dynamo-worker`` entry point: flags → ``WorkerSettings`` → the runtime.

Invalid flags, taints or topology exit 2 with the exact reason before anything is
registered.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dynamod import __version__
from dynamod.errors import InvalidInputError
from dynamod.http.limits import HttpLimits
from dynamod.lifecycle import guarded, run
from dynamod.taints import TaintLimits
from dynamod.worker.engines.mocker import MockerConfig

if TYPE_CHECKING:
    from dynamod.auth import Tokens

EX_USAGE = 2

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Arguments after `--` are the upstream server's command line (--launch).
    context_settings={"help_option_names": ["-h", "--help"], "allow_extra_args": True},
)


def _version(value: bool) -> None:
    if value:
        print(f"dynamo-worker {__version__}")
        raise typer.Exit


def parse_pairs(pairs: list[str], flag: str) -> dict[str, str]:
    """``["zone=a", "rack=r1"]`` → ``{"zone": "a", "rack": "r1"}``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidInputError(f"{flag} {pair!r} must look like DOMAIN=VALUE")
        if key in out:
            raise InvalidInputError(f"{flag} names domain {key!r} twice")
        out[key] = value
    return out


def read_tokens(path: Path | None) -> Tokens | None:
    """The tokens the taint route accepts: None without a file; else the file's one bearer
    token (named after the file in the audit log), or dynamod's tokens file format (TOML
    ``[[token]]`` entries with ``name``, ``secret``, ``role`` and ``prefixes``)."""
    from dynamod.auth import Principal, Tokens, read_token_file

    if path is None:
        return None
    try:
        toml = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):  # a bare secret, or
        toml = {}  # unreadable: read_token_file says why
    if isinstance(toml.get("token"), list):
        return Tokens.load(path)
    return Tokens(((read_token_file(path), Principal(path.name, "write")),))


def parse_vllm_args(pairs: list[str]) -> dict[str, object]:
    """``["max_model_len=1024"]`` → ``{"max_model_len": 1024}`` (names with dashes get
    underscores; a value is JSON when it parses, else a string). vLLM checks the names."""
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise InvalidInputError(f"--vllm-arg {pair!r} must look like NAME=VALUE")
        try:
            out[name.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[name.replace("-", "_")] = raw
    return out


@app.command()
def worker(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="Name of the model this worker serves.")],
    store: Annotated[
        str,
        typer.Option(
            envvar="DYNAMO_STORE",
            help="Discovery store URL: file:///dir, etcd://host:2379/prefix, "
            "nats://host:4222/bucket or memory://.",
        ),
    ],
    engine: Annotated[
        str,
        typer.Option(
            help="Inference engine: mocker (simulated), vllm (vLLM in this process) or "
            "openai (an OpenAI-compatible server beside it, at --upstream)."
        ),
    ] = "mocker",
    model_path: Annotated[
        Path | None,
        typer.Option(
            help="vllm: the model's directory (weights, config, tokenizer). openai: the "
            "directory of the model's tokenizer, published to routers."
        ),
    ] = None,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="vllm: an engine argument NAME=VALUE (repeatable), e.g. max_model_len=1024; "
            "VALUE is read as JSON when it parses."
        ),
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(
            help="openai: base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000."
        ),
    ] = None,
    launch: Annotated[
        bool,
        typer.Option(
            help="openai: start the upstream server with the command line after `--` (in "
            "its own process group; SIGTERM after this worker drained)."
        ),
    ] = False,
    scrape_interval: Annotated[
        float, typer.Option(help="openai: seconds between two scrapes of the upstream's /metrics.")
    ] = 0.5,
    upstream_timeout: Annotated[
        float, typer.Option(help="openai: seconds the upstream may take to become healthy.")
    ] = 600.0,
    kv_events: Annotated[
        str,
        typer.Option(
            help="Forward the engine's KV cache events to routers (KV-aware prefix routing): "
            "auto (mocker, vllm: on; openai: the publishers the upstream's /kv_event_sources "
            "lists), off, or (openai) a vLLM publisher endpoint tcp://HOST:PORT.",
            metavar="auto|off|ENDPOINT",
        ),
    ] = "auto",
    namespace: Annotated[str, typer.Option(help="Discovery namespace.")] = "dynamo",
    component: Annotated[str, typer.Option(help="Discovery component.")] = "backend",
    endpoint: Annotated[str, typer.Option(help="Discovery endpoint.")] = "generate",
    taint: Annotated[
        list[str] | None, typer.Option(help="Initial taint (repeatable), e.g. capacity/fast.")
    ] = None,
    topology: Annotated[
        list[str] | None,
        typer.Option(
            help="Topology domain DOMAIN=VALUE (repeatable); generates a "
            "dynamo.topology/DOMAIN=VALUE taint."
        ),
    ] = None,
    kv_transfer_domain: Annotated[
        str | None, typer.Option(help="Topology domain that constrains KV transfer.")
    ] = None,
    kv_transfer_enforcement: Annotated[
        str | None, typer.Option(help="required or preferred.")
    ] = None,
    kv_transfer_preferred_weight: Annotated[
        float | None, typer.Option(help="Weight 0..1 when enforcement is preferred.")
    ] = None,
    host: Annotated[str, typer.Option(help="Inference HTTP bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Inference HTTP port (0 picks a free one).")] = 0,
    advertise_host: Annotated[
        str | None, typer.Option(help="Host name routers use to reach this worker.")
    ] = None,
    system_host: Annotated[str, typer.Option(help="System HTTP bind address.")] = "127.0.0.1",
    system_port: Annotated[
        int, typer.Option(envvar="DYN_SYSTEM_PORT", help="System HTTP port (0 picks one).")
    ] = 0,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the bearer token the taint route requires, or a dynamod tokens "
            "file ([[token]] entries: name, secret, role, prefixes)."
        ),
    ] = None,
    audit_log: Annotated[
        Path | None,
        typer.Option(help="Append one JSON line per taint update to this file (default: the log)."),
    ] = None,
    max_taints: Annotated[
        int, typer.Option(help="Most taints a taint update may leave this worker.")
    ] = TaintLimits.count,
    max_taint_bytes: Annotated[
        int, typer.Option(help="Most bytes of taints (UTF-8, one per separator) it may leave.")
    ] = TaintLimits.bytes,
    lease_ttl: Annotated[float, typer.Option(help="Seconds the record outlives a crash.")] = 10.0,
    grace: Annotated[
        float, typer.Option(help="Seconds in-flight requests get to finish on SIGTERM.")
    ] = 10.0,
    http_head_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's head (else 408).")
    ] = HttpLimits.head_timeout,
    http_body_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's body (else 408).")
    ] = HttpLimits.body_timeout,
    http_idle_timeout: Annotated[
        float, typer.Option(help="Seconds a kept-alive connection may idle.")
    ] = HttpLimits.idle_timeout,
    num_kv_blocks: Annotated[int, typer.Option(help="Mocker: KV cache blocks.")] = 16384,
    block_size: Annotated[int, typer.Option(help="Mocker: tokens per KV block.")] = 64,
    max_num_seqs: Annotated[
        int,
        typer.Option(help="Mocker, openai: requests at once (openai: unless --launch has it)."),
    ] = 256,
    max_num_batched_tokens: Annotated[
        int,
        typer.Option(
            help="Mocker, openai: tokens per scheduler step (openai: unless --launch has it)."
        ),
    ] = 8192,
    context_length: Annotated[int, typer.Option(help="Mocker: context length.")] = 8192,
    speedup_ratio: Annotated[
        float, typer.Option(help="Mocker: divides every simulated duration.")
    ] = 1.0,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Run one inference worker: register it in discovery, serve OpenAI-compatible routes,
    and accept taint updates on its system server."""
    from dynamod import logs
    from dynamod.worker.engines.upstream import UpstreamConfig
    from dynamod.worker.runtime import WorkerSettings, run_worker

    try:
        if ctx.args and not launch:
            raise InvalidInputError(f"unexpected arguments {ctx.args!r}; did you mean --launch?")
        if launch and not ctx.args:
            raise InvalidInputError("--launch needs the server's command line after `--`")
        settings = WorkerSettings(
            store=store,
            model=model,
            engine=engine,
            namespace=namespace,
            component=component,
            endpoint=endpoint,
            taints=tuple(taint or ()),
            topology=parse_pairs(topology or [], "--topology"),
            kv_transfer_domain=kv_transfer_domain,
            kv_transfer_enforcement=kv_transfer_enforcement,
            kv_transfer_preferred_weight=kv_transfer_preferred_weight,
            host=host,
            port=port,
            advertise_host=advertise_host,
            system_host=system_host,
            system_port=system_port,
            tokens=read_tokens(token_file),
            audit_log=audit_log,
            taint_limits=TaintLimits(max_taints, max_taint_bytes),
            lease_ttl=lease_ttl,
            grace=grace,
            http_limits=HttpLimits(http_head_timeout, http_body_timeout, http_idle_timeout),
            mocker=MockerConfig(
                model_name=model,
                num_kv_blocks=num_kv_blocks,
                block_size=block_size,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                context_length=context_length,
                speedup_ratio=speedup_ratio,
                enable_kv_events=kv_events != "off",
            ),
            kv_events=kv_events,
            model_path=model_path,
            vllm_args=parse_vllm_args(vllm_arg or []),
            upstream=None
            if upstream is None
            else UpstreamConfig(
                url=upstream,
                model_name=model,
                launch=tuple(ctx.args),
                tokenizer_path=model_path,
                scrape_interval=scrape_interval,
                start_timeout=upstream_timeout,
                stop_timeout=grace + 20.0,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                kv_events=kv_events,
            ),
        )
    except InvalidInputError as exc:
        print(f"dynamo-worker: error: {exc}", file=sys.stderr)
        raise typer.Exit(EX_USAGE) from None
    logs.configure(log_level.lower())
    raise typer.Exit(run(lambda: guarded(run_worker(settings), "dynamo-worker"), server=True))


def main() -> None:
    from dynamod.logs import grpc_errors_only

    grpc_errors_only()
    app(prog_name="dynamo-worker")
