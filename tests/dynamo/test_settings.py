"""Where a Dynamo fleet's system ports are, from dynamod's settings: a template and a
table (TOML) or pairs (environment), checked when the settings load; and what
``check-config`` says of a Dynamo store URL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynamod import settings as daemon_settings
from dynamod.errors import ConfigError
from tests.support.processes import BIN, env


def test_a_template_and_a_table_from_the_file_the_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "dynamod.toml"
    path.write_text(
        'store = "dynamo+etcd://10.0.0.1:2379"\n'
        'dynamo_system_address = "http://{host}:9090"\n'
        "[dynamo_system_addresses]\n"
        '13b0a2323c378618 = "http://10.0.0.9:9345"\n'
    )
    found = daemon_settings.load(path=path, environ={}).dynamo_addresses
    assert found.template == "http://{host}:9090"
    assert dict(found.by_id) == {"13b0a2323c378618": "http://10.0.0.9:9345"}
    environ = {"DYNAMO_DYNAMO_SYSTEM_ADDRESSES": "1f=http://10.0.0.1:1, 2e=http://10.0.0.2:2"}
    found = daemon_settings.load(path=path, environ=environ).dynamo_addresses
    assert dict(found.by_id) == {"1f": "http://10.0.0.1:1", "2e": "http://10.0.0.2:2"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"DYNAMO_DYNAMO_SYSTEM_ADDRESS": "http://{host}:{port}"}, "names {port}"),
        ({"DYNAMO_DYNAMO_SYSTEM_ADDRESSES": "1f"}, "expected 'id=URL,id=URL'"),
        ({"DYNAMO_DYNAMO_SYSTEM_ADDRESSES": "1f=tcp://x:1"}, "must be an http://"),
    ],
)
def test_an_unusable_address_setting_is_refused_by_name(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        daemon_settings.load(environ=environ)
    assert message in str(caught.value)


def test_check_config_takes_a_dynamo_store_and_refuses_a_prefix(tmp_path: Path) -> None:
    base = {k: v for k, v in env().items() if not k.startswith("DYNAMO")}
    audit = ("--audit-log", str(tmp_path / "audit.log"))

    def check(url: str) -> subprocess.CompletedProcess[str]:
        argv = [str(BIN / "dynamod"), "--store", url, *audit, "check-config"]
        return subprocess.run(argv, capture_output=True, text=True, env=base, timeout=60)

    assert check(f"dynamo+file://{tmp_path}").returncode == 0
    refused = check("dynamo+etcd://127.0.0.1:2379/dynamo")
    assert refused.returncode != 0 and "Dynamo keeps its keys at the root" in refused.stderr
