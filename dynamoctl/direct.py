"""The commands scripts run in loops, ``workers ls`` and ``taints add``, parsed by hand and
run without typer.

Importing typer and click and building even one command's tree costs several times
Python's own start-up, and a script that lists or taints workers in a loop pays it every
time. So ``main`` asks ``run`` after ``fastpath``: for a command line it reads with
certainty, it builds the ``Options`` and the command's arguments as click would and runs
the very session body the typer command runs (``listing.command``, ``updates.command``),
so what is printed and the exit status are the same. Anything else — another command, an
option it does not know or a short-option cluster, ``--``, ``--help``, a value that would
fail a check (a usage error), shell completion, a config file whose values are not plainly
what they should be — returns None, and the live CLI parses it and says what it says.
The calls are made by ``dynamod.client.light.LightClient`` (``session.run_light``): gRPC's
calls over our own HTTP/2 on a blocking socket, with neither gRPC nor asyncio imported, which
together cost a run about a third of its time. The same errors and lines come back; where
that client is not sure (a connection it cannot make, a proxy, TLS without a CA) it leaves
the calls to ``AsyncClient``, which says why in gRPC's words. A watch (it may run for days,
and reconnects), ``--all`` that asks on the terminal, and ``--debug`` (whose lines are
gRPC's logging) run on ``AsyncClient`` and its event loop (``session.run_body``).
``tests/cli/test_direct.py`` runs a matrix of command lines both ways and compares stdout,
stderr and the exit status, and checks which client made the calls.

Only ``gc``, ``os`` and ``sys`` are imported until the command line is read: the command's own
modules are imported when it runs.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False  # typing costs more to import than reading a command line
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from dynamoctl.invocation import Options
    from dynamoctl.session import Body, LightBody

    Plan = tuple[Body, LightBody | None, bool]
    """The session body; the same as a ``LightBody`` when the light client may run it
    (None for a stream, which may run for days and reconnect: gRPC's client's work, and
    for a question to answer, ``--all`` without ``--yes``: stdin read on a thread of the
    event loop); whether it is a stream."""

# The global options (app.root), each: its field, whether it takes a value, its variable.
GLOBAL: dict[str, tuple[str, bool, str | None]] = {
    "-e": ("endpoint", True, "DYNAMO_ENDPOINT"),
    "--endpoint": ("endpoint", True, "DYNAMO_ENDPOINT"),
    "--token-file": ("token_file", True, "DYNAMO_TOKEN_FILE"),
    "--tls": ("tls", False, "DYNAMO_TLS"),
    "--cacert": ("cacert", True, "DYNAMO_CACERT"),
    "--cert": ("cert", True, "DYNAMO_CERT"),
    "--cert-key": ("cert_key", True, "DYNAMO_CERT_KEY"),
    "--timeout": ("timeout", True, "DYNAMO_TIMEOUT"),
    "-o": ("output", True, None),
    "--output": ("output", True, None),
    "--no-headers": ("no_headers", False, None),
    "--debug": ("debug", False, None),
    "--context": ("context", True, "DYNAMO_CONTEXT"),
}
PATHS = ("token_file", "cacert", "cert", "cert_key")
# Each command's own options, as GLOBAL's (no variables).
OWN: dict[tuple[str, str], dict[str, tuple[str, bool]]] = {
    ("workers", "ls"): {
        "-l": ("selector", True), "--selector": ("selector", True), "--model": ("model", True),
        "-w": ("watch", False), "--watch": ("watch", False), "--sort-by": ("sort_by", True),
    },
    ("taints", "add"): {
        "-l": ("selector", True), "--selector": ("selector", True), "--all": ("all", False),
        "--if-revision": ("if_revision", True), "--dry-run": ("dry_run", False),
        "-y": ("yes", False), "--yes": ("yes", False),
    },
}  # fmt: skip
# A boolean variable's spellings read with certainty (click reads more, then decides).
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class Unsure(Exception):
    """The command line is not one this module reads with certainty: ask the live CLI."""


def run(argv: list[str], environ: Mapping[str, str]) -> int | None:
    """Run ``argv`` if it is one of these commands, plainly given: its exit status; else
    None (nothing was printed or done)."""
    found = plan(argv, environ)
    if found is None:
        return None
    from dynamoctl import session

    options, (body, light, stream) = found
    if stream:
        gc.enable()  # it may run for days (main turns the collector off for start-up)
    if light is None or options.debug:  # what --debug shows is gRPC's own logging
        return session.run_body(options, body, stream=stream)
    return session.run_light(options, light)


def plan(argv: list[str], environ: Mapping[str, str]) -> tuple[Options, Plan] | None:
    """What ``run`` would run for ``argv``: the options and the ``Plan``; None for a
    command line left to the live CLI. Runs nothing."""
    if len(argv) < 2 or environ.get("_DYNAMOCTL_COMPLETE"):
        return None
    try:
        start = _command_at(argv)
        command = argv[start], argv[start + 1]
        root = _options(argv[:start], GLOBAL)
        given = _options(argv[start + 2 :], {**GLOBAL, **OWN[command]}, positional=True)
        options = _settled(root, given, environ, chosen_context(argv, environ))
        found = _ls(given) if command == ("workers", "ls") else _taints_add(given)
    except Unsure:
        return None
    return options, found


def leave(code: int) -> None:
    """End the process now with ``code``, as the program (not a caller of ``main``) does
    after ``run``: the exit handlers run and stdout and stderr are flushed, but the
    interpreter's teardown of every module is skipped, which for gRPC's alone costs about
    as much as Python's start-up. Nothing is left to tear down by then: the session's loop
    drained every task and thread, and the client closed its channel. (``dynamod.lifecycle``
    ends a process whose threads outlived its drain the same way, without the exit
    handlers.)"""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # gone, or closed: as the interpreter's own exit
            pass
    os._exit(code)


def chosen_context(args: list[str], environ: Mapping[str, str]) -> str | None:
    """``--context NAME`` wherever it is on the command line (before or after the command:
    the config file is read before click parses anything), else ``DYNAMO_CONTEXT``."""
    for at, word in enumerate(args):
        if word == "--":
            break
        if word == "--context" and at + 1 < len(args):
            return args[at + 1]
        if word.startswith("--context="):
            return word.partition("=")[2]
    return environ.get("DYNAMO_CONTEXT") or None


def _command_at(argv: list[str]) -> int:
    """Where the command's two words start: after the global options and their values."""
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        found = GLOBAL.get(argv[at].partition("=")[0])
        if found is None:
            raise Unsure
        at += 2 if found[1] and "=" not in argv[at] else 1
    if at + 1 >= len(argv) or (argv[at], argv[at + 1]) not in OWN:
        raise Unsure
    return at


def _options(
    words: list[str], known: Mapping[str, tuple[Any, ...]], *, positional: bool = False
) -> dict[str, Any]:
    """The options in ``words`` by field (the last one given wins, as in click), flags as
    True, values as typed; with ``positional`` the rest under ``""`` in order."""
    found: dict[str, Any] = {"": []}
    rest = iter(words)
    for word in rest:
        if word == "-" and positional:
            found[""].append(word)
            continue
        if not word.startswith("-"):
            if not positional:
                raise Unsure
            found[""].append(word)
            continue
        name, equals, value = word.partition("=")
        spec = known.get(name)
        if spec is None or word == "--" or (equals and (not spec[1] or name[:2] != "--")):
            raise Unsure  # unknown, a cluster, --help, a flag given a value
        if not spec[1]:
            found[spec[0]] = True
            continue
        if not equals:
            following = next(rest, None)
            if following is None or following.startswith("-"):
                raise Unsure  # missing, or click might read it otherwise
            value = following
        found[spec[0]] = value
    return found


def _settled(
    root: dict[str, Any], given: dict[str, Any], environ: Mapping[str, str], context: str | None
) -> Options:
    """The ``Options`` click would build: the root's flags > its variables > the config
    file > defaults, then what was given after the command wins."""
    from dynamoctl.fastpath import config_path
    from dynamoctl.invocation import FIELDS, Options
    from dynamod.client.endpoint import load_config
    from dynamod.errors import ConfigError

    try:
        file = load_config(config_path(environ), context)
    except ConfigError:  # the live CLI reports it
        raise Unsure from None
    chosen: dict[str, Any] = {}
    for field in FIELDS:
        if field in root:
            chosen[field] = _typed(field, root[field])
        elif (value := _variable(field, environ)) is not None:
            chosen[field] = value
        elif field in file:
            chosen[field] = _from_file(field, file[field])
    for field in FIELDS:
        if field in given:
            chosen[field] = _typed(field, given[field])
    return Options(**chosen)


def _typed(field: str, value: Any) -> Any:
    """A value from the command line (a flag's True, else text) as its option's type."""
    if value is True:
        return True
    if field in PATHS:
        from pathlib import Path

        return Path(value)
    if field == "timeout":
        return _seconds(value)
    if field == "output":
        return _output(value)
    return value


def _variable(field: str, environ: Mapping[str, str]) -> Any:
    name = next((v for f, _, v in GLOBAL.values() if f == field and v), None)
    raw = environ.get(name) if name else None
    if not raw:  # click ignores an empty variable too
        return None
    if field == "tls":
        spelled = raw.strip().lower()
        if spelled not in TRUE + FALSE:
            raise Unsure
        return spelled in TRUE
    return _typed(field, raw)


def _from_file(field: str, value: Any) -> Any:
    """A config file's value, when it is already of its option's type."""
    kinds: dict[str, Callable[[Any], bool]] = {
        "tls": lambda v: type(v) is bool,
        "no_headers": lambda v: type(v) is bool,
        "timeout": lambda v: type(v) in (int, float),
    }
    if not kinds.get(field, lambda v: type(v) is str)(value):
        raise Unsure
    if field == "timeout":
        return _seconds(str(value))
    return _typed(field, value)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise Unsure from None
    if not seconds > 0:
        raise Unsure
    return seconds


def _output(value: str) -> str:
    from dynamoctl.invocation import OUTPUTS

    if value in OUTPUTS:
        return value
    if value.partition("=")[0] not in ("jsonpath", "custom-columns"):
        raise Unsure
    from dynamoctl.jsonpath import Shape, TemplateError

    try:
        Shape(value)
    except TemplateError:
        raise Unsure from None
    return value


def _ls(given: dict[str, Any]) -> Plan:
    """``workers ls``: no arguments; ``--sort-by`` must parse."""
    if given[""]:
        raise Unsure
    sort_by = given.get("sort_by")
    if sort_by is not None:
        from dynamoctl.jsonpath import TemplateError, parse_path

        try:
            parse_path(sort_by)
        except TemplateError:
            raise Unsure from None
    from dynamoctl import listing

    selector, model = given.get("selector"), given.get("model")
    if given.get("watch"):
        return listing.command(selector, model, True, sort_by), None, True
    body = listing.listed(selector, model, sort_by)
    return body, body, False


def _taints_add(given: dict[str, Any]) -> Plan:
    """``taints add``: the rules of ``commands.taints.add`` (``_split``, ``target``,
    ``check_all``), where breaking one is a usage error for the live CLI to report."""
    words: list[str] = given[""]
    selector, everyone = given.get("selector"), bool(given.get("all"))
    revision = _revision(given.get("if_revision"))
    dry_run, yes = bool(given.get("dry_run")), bool(given.get("yes"))
    # With -l or --all there is no ID: the first argument is a taint too (``_split``).
    worker = words[0] if words and selector is None and not everyone else None
    taints = words if worker is None else words[1:]
    if [worker is not None, selector is not None, everyone].count(True) != 1 or not taints:
        raise Unsure
    if revision is not None and worker is None:
        raise Unsure
    if everyone and not (yes or dry_run or sys.stdin.isatty()):
        raise Unsure
    from dynamoctl import updates
    from dynamod.targets import Target

    target = Target(worker, selector, everyone, revision)
    body = updates.command("add", target, taints, dry_run=dry_run, yes=yes)
    asks = everyone and not (yes or dry_run)
    return body, None if asks else body, False


def _revision(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        revision = int(text)
    except ValueError:
        raise Unsure from None
    if revision < 1:
        raise Unsure
    return revision
