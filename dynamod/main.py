"""The ``dynamod`` entry point.

``dynamod [OPTIONS]`` runs the daemon; ``dynamod check-config`` validates the settings
without starting; ``dynamod demo`` runs the daemon on a fresh file store with mocker
workers. Options go before the subcommand, like ``git``'s global options.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dynamod import __version__
from dynamod.errors import ConfigError, ListenError
from dynamod.lifecycle import EX_UNAVAILABLE

if TYPE_CHECKING:
    from dynamod.settings import DaemonSettings

EX_CONFIG = 78  # sysexits.h EX_CONFIG: systemd does not restart-loop on a config error
EX_USAGE = 2

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="dynamod: route LLM inference requests across workers by their taints.",
)


def _version(value: bool) -> None:
    if value:
        print(f"dynamod {__version__}")
        raise typer.Exit


@app.callback(invoke_without_command=True)
def main_options(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(help="TOML config file (default $DYNAMO_CONFIG, /etc/dynamod/dynamod.toml)."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Discovery store URL (file://, etcd://, nats://, memory://), or an NVIDIA "
            "Dynamo fleet's, read only: dynamo+etcd://HOST:PORT, dynamo+file:///DIR."
        ),
    ] = None,
    listen: Annotated[
        list[str] | None,
        typer.Option(help="gRPC listener, unix:///PATH or HOST:PORT (repeatable)."),
    ] = None,
    http: Annotated[
        str | None, typer.Option(help="HOST:PORT of the OpenAI front and /metrics; '' disables.")
    ] = None,
    tokens_file: Annotated[Path | None, typer.Option(help="TOML file of bearer tokens.")] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="TLS certificate for TCP listeners.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS private key.")] = None,
    tls_client_ca: Annotated[
        Path | None, typer.Option(help="CA for client certificates (mTLS).")
    ] = None,
    audit_log: Annotated[Path | None, typer.Option(help="Audit log path (JSON lines).")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    log_format: Annotated[str | None, typer.Option(help="auto, plain or json.")] = None,
    grace: Annotated[
        float | None, typer.Option(help="Seconds in-flight requests get at shutdown.")
    ] = None,
    drain: Annotated[
        float | None, typer.Option(help="Seconds of the bounded drain at exit.")
    ] = None,
    replica_id: Annotated[str | None, typer.Option(help="This replica's name.")] = None,
    state_store: Annotated[
        str | None,
        typer.Option(
            help="Store URL for pool policies, their history and the pool leader's key "
            "(default: the discovery store; needed on an NVIDIA Dynamo fleet)."
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Run the dynamod daemon (or a subcommand)."""
    flags: dict[str, object] = {
        "store": store,
        "listen": listen or None,
        "http": http,
        "tokens_file": tokens_file,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "tls_client_ca": tls_client_ca,
        "audit_log": audit_log,
        "log_level": log_level,
        "log_format": log_format,
        "grace": grace,
        "drain": drain,
        "replica_id": replica_id,
        "state_store": state_store,
    }
    ctx.obj = (config, flags)
    if ctx.invoked_subcommand is None:
        raise typer.Exit(_serve(config, flags))


def _load(config: Path | None, flags: dict[str, object]) -> DaemonSettings:
    from dynamod import settings as settings_module

    return settings_module.load(path=config, flags=flags)


def _checked(config: Path | None, flags: dict[str, object]) -> DaemonSettings | int:
    """The settings, with everything a start needs from them verified
    (``settings.checks.verify``); else the exit code, the reason said in one line on stderr:
    ``EX_CONFIG`` for a configuration error, ``EX_UNAVAILABLE`` for a listener that cannot
    be bound now. check-config and the start call this one function."""
    from dynamod.settings.checks import verify

    try:
        settings = _load(config, flags)
        verify(settings)
    except ConfigError as exc:
        print(f"dynamod: configuration error: {exc}", file=sys.stderr)
        return EX_CONFIG
    except ListenError as exc:
        print(f"dynamod: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    return settings


def _serve(config: Path | None, flags: dict[str, object]) -> int:
    from dynamod import logs
    from dynamod.daemon import run_daemon
    from dynamod.lifecycle import guarded, run

    settings = _checked(config, flags)
    if isinstance(settings, int):
        return settings
    logs.configure(settings.log_level, settings.log_format)
    return run(
        lambda: guarded(run_daemon(settings, lambda: _load(config, flags)), "dynamod"),
        drain=settings.drain,
        server=True,
    )


@app.command("check-config")
def check_config(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="TOML config file to check.")] = None,
) -> None:
    """Validate the settings (file, environment, flags) and print them; start nothing."""
    parent_config, flags = ctx.obj
    settings = _checked(config or parent_config, flags)
    if isinstance(settings, int):
        raise typer.Exit(settings)
    for name, value in asdict(settings).items():
        print(f"{name} = {value!r}")
    print("configuration OK", file=sys.stderr)


@app.command()
def demo(
    workers: Annotated[int, typer.Option(help="How many mocker workers to start.")] = 3,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Directory for the store and socket (default: a temp dir)."),
    ] = None,
    http: Annotated[str, typer.Option(help="HOST:PORT of the OpenAI front.")] = "127.0.0.1:8080",
    engine: Annotated[
        str, typer.Option(help="The workers' engine: mocker, or vllm (needs --model-path).")
    ] = "mocker",
    model_path: Annotated[
        Path | None, typer.Option(help="vllm: the model directory every worker serves.")
    ] = None,
    python: Annotated[
        Path | None,
        typer.Option(help="vllm: the Python (with vLLM installed) the workers run under."),
    ] = None,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(help="vllm: an engine argument NAME=VALUE for every worker (repeatable)."),
    ] = None,
) -> None:
    """Run dynamod on a file store with mocker (or vLLM) workers; Ctrl-C stops everything."""
    from dynamod.demo import DemoEngine, run_demo

    try:
        chosen = DemoEngine.of(engine, model_path, python, tuple(vllm_arg or ()))
    except ConfigError as exc:
        print(f"dynamod: error: {exc}", file=sys.stderr)
        raise typer.Exit(EX_USAGE) from None
    raise typer.Exit(run_demo(workers=workers, directory=directory, http=http, engine=chosen))


def main() -> None:
    from dynamod.logs import grpc_errors_only

    grpc_errors_only()
    app(prog_name="dynamod")
