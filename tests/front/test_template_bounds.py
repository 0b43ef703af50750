"""The bounds on a model's own chat template and tokenizer, where they are enforced: the
template's sandbox (``tokenizers/hf.py``: operators checked before they build, output read
piece by piece, every error one ``TokenizerFailedError``) and the prompt process's CPU
budget (``prompts/cpu_budget.py``: a timer for Python, the kernel's limit for the rest)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from dynamod.errors import ConfigError
from dynamod.settings import DaemonSettings
from dynamod.tokenizers import ChatMessage
from dynamod.tokenizers.base import TemplateRefusedError, TokenizerFailedError
from dynamod.tokenizers.hf import POWER_BITS, HfTokenizer
from dynamod.tokenizers.limits import MIB, TokenizerLimits
from tests.support.processes import env

LIMIT = 1000
CHAT = [ChatMessage("user", "hello")]


def tokenizer_json(split: str | None = None) -> str:
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = (
        pre_tokenizers.WhitespaceSplit()
        if split is None
        else pre_tokenizers.Split(Regex(split), behavior="isolated")
    )
    return str(tokenizer.to_str())


def with_template(template: str, *, split: str | None = None) -> HfTokenizer:
    files = {
        "tokenizer.json": tokenizer_json(split),
        "tokenizer_config.json": json.dumps({"chat_template": template}),
    }
    return HfTokenizer(files, max_output=LIMIT)


@pytest.mark.parametrize(
    ("template", "refusal"),
    [
        ("{{ 'x' * 500000000 }}", "'*' would build a value of 500000000 items, over the limit of"),
        ("{{ 500000000 * 'x' }}", "'*' would build a value of 500000000 items"),
        ("{{ messages * 100000 }}", "'*' would build a value of 100000 items"),
        ("{{ 'x' * 999 + 'y' * 999 }}", "'+' would build a value of 1998 items"),
        ("{{ '%0999999999d' % 1 }}", "'%' would build a value of 999999999 items"),
        ("{{ '%*d' % (5, 1) }}", "'%' would build a value of"),
        (
            "{{ 10 ** 100000 }}",
            f"'**' would build a value of 400000 bits, over the limit of {POWER_BITS}",
        ),
        (
            "{{ (2 ** 30000) * (2 ** 30000) * (2 ** 30000) }}",
            "'*' would build a value of 90002 bits",
        ),
    ],
)
def test_an_operator_is_refused_before_it_builds_a_value_past_the_limit(
    template: str, refusal: str
) -> None:
    with pytest.raises(TokenizerFailedError, match="its chat template's " + _escaped(refusal)):
        with_template(template).render_chat(CHAT)


def test_the_same_operators_within_the_limit_work_as_jinja_has_them() -> None:
    template = "{{ 'a' + 'b' }} {{ 'x' * 3 }} {{ 3 * 4 }} {{ '%03d' % 7 }} {{ 2 ** 10 }}"
    assert with_template(template).render_chat(CHAT) == "ab xxx 12 007 1024"


def test_the_output_is_refused_past_the_limit_and_taken_up_to_it() -> None:
    exact = with_template("{% for i in range(100) %}0123456789{% endfor %}")
    assert len(exact.render_chat(CHAT)) == LIMIT
    over = with_template("{% for i in range(100) %}0123456789{% endfor %}!")
    with pytest.raises(TokenizerFailedError, match=f"rendered more than {LIMIT} characters"):
        over.render_chat(CHAT)
    one_piece = with_template("{{ 'x' | center(5000) }}")  # no operator: caught as output
    with pytest.raises(TokenizerFailedError, match="rendered more than"):
        one_piece.render_chat(CHAT)


@pytest.mark.parametrize(
    ("template", "raised"),
    [
        ("{{ range(10 ** 30) }}", "OverflowError: Python int too large"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
        ("{{ messages[0]['content'] + 1 }}", "TypeError: can only concatenate"),
        ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
        ("{{ ''.__class__.__subclasses__() }}", "SecurityError: access to attribute"),
        ("{{ messages.append(1) }}", "SecurityError"),
        ("{{ x.y.z }}", "UndefinedError: 'x' is undefined"),
    ],
)
def test_whatever_a_template_raises_is_one_tokenizer_failure_naming_it(
    template: str, raised: str
) -> None:
    with pytest.raises(TokenizerFailedError, match="its chat template failed: " + _escaped(raised)):
        with_template(template).render_chat(CHAT)


def test_raise_exception_is_the_requests_refusal_and_its_message_is_cut_short() -> None:
    with pytest.raises(TemplateRefusedError, match=r"refused the messages: only users$"):
        with_template("{{ raise_exception('only users') }}").render_chat(CHAT)
    echo = with_template("{{ raise_exception(messages[0]['content']) }}")
    with pytest.raises(TemplateRefusedError) as long:
        echo.render_chat([ChatMessage("user", "x" * 100_000)])
    assert len(str(long.value)) < 400


def test_a_tokenizer_that_panics_in_rust_is_a_tokenizer_failure() -> None:
    """Oniguruma gives up on a catastrophic pattern and the tokenizers library panics:
    pyo3's ``PanicException`` is a ``BaseException``, taken for the model's failure."""
    panicking = with_template("{{ messages[0]['content'] }}", split=r"(\w+\s?)*$")
    with pytest.raises(TokenizerFailedError, match="its tokenizer failed: PanicException"):
        panicking.encode_chat([ChatMessage("user", "a" * 40 + "!")])


def test_a_cpu_budget_stops_python_at_the_bound_and_restores_the_process() -> None:
    """In a process of its own, as the budget is used (one thread: a test runner's other
    threads could hold the GIL past the kernel's limit, which would end the runner)."""
    script = textwrap.dedent(
        """
        import resource, signal
        from dynamod.prompts import cpu_budget as budget
        before = resource.getrlimit(resource.RLIMIT_CPU)
        budget.install()
        try:
            with budget.cpu_budget(0.2):
                while True:
                    pass
        except budget.CpuBudgetExceeded as exc:
            print(exc)
        with budget.cpu_budget(5):
            assert sum(range(1000)) == 499500
        assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
        assert resource.getrlimit(resource.RLIMIT_CPU) == before
        print("restored")
        """
    )
    done = run_python(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ran past its CPU-time bound of 0.2 s", "restored"]


def test_code_that_never_returns_to_python_is_ended_by_the_kernel_past_the_budget() -> None:
    """A tokenizer's Rust pipeline backtracking for minutes: the timer's signal waits for
    Python, which never comes back, so ``RLIMIT_CPU`` ends the process with ``SIGXCPU``."""
    script = textwrap.dedent(
        """
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers
        from dynamod.prompts import cpu_budget as budget
        t = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        t.pre_tokenizer = pre_tokenizers.Split(Regex(r"(a|aa)+b"), behavior="isolated")
        budget.install()
        with budget.cpu_budget(0.5):
            t.encode(("a" * 26 + "!") * 100000)
        """
    )
    assert run_python(script).returncode == -signal.SIGXCPU


def test_the_tokenizer_limits_are_settings_checked_at_load() -> None:
    settings = DaemonSettings(template_cpu_seconds=0.5, tokenizer_bundle_max_mb=16)
    limits = settings.tokenizer_limits
    assert limits.cpu_seconds == 0.5 and limits.bundle_bytes == 16 * MIB
    assert limits.cpu_for(2 * MIB) == pytest.approx(1.5)
    assert DaemonSettings().tokenizer_limits == TokenizerLimits()
    with pytest.raises(ConfigError, match="cpu_seconds must be above 0"):
        DaemonSettings(template_cpu_seconds=0)
    with pytest.raises(ConfigError, match="template_max_output_mb must be a number of MiB"):
        DaemonSettings(template_max_output_mb=-1)
    with pytest.raises(ConfigError, match="process_memory must be at least 256 MiB"):
        DaemonSettings(prompt_process_memory_mb=64)
    with pytest.raises(ConfigError, match="must hold at least one bundle"):
        DaemonSettings(tokenizer_cache_mb=1, tokenizer_bundle_max_mb=2)


def run_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _escaped(text: str) -> str:
    import re

    return re.escape(text)
