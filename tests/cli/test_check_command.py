"""`crossbar check` and `twistd crossbar` on good, bad, missing and non-TOML files."""

import pathlib
import subprocess
import sys

import pytest

from crossbar.cli.main import main
from crossbar.config.values import ConfigError, load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "config.toml"
BAD = """
[server]
lease_idle = "forever"
[hosts.titan]
url = "ftp://titan"
models = ["qwen-coder"]
[routes.convo]
hosts = ["tytan"]
affinity = "sticky"
"""


def test_the_example_config_is_valid_and_uses_every_server_key():
    config = load_config(EXAMPLE)
    text = EXAMPLE.read_text()
    for key in config.server.__attrs_attrs__:
        assert f"\n{key.name} = " in text, key.name
    assert config.route("proj-alpha").template == "projects"


def test_check_prints_the_resolved_hosts_routes_and_templates(capsys):
    assert main(["check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "titan  http://127.0.0.1:9001" in out
    assert "model qwen-coder -> Qwen3-Coder-30B-A3B-Q4_K_M: parallel 2, ctx 65536" in out
    assert "convo: hosts titan, atlas" in out
    assert "projects (match 'proj-*')" in out


def test_check_prints_each_routes_queue_share(capsys):
    assert main(["check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "queue yes (priority 1, shared line, max_in_flight 6, max_queued 32)" in out
    assert "queue yes (priority 0, weight 1, max_in_flight 4, max_queued 48)" in out
    shared = (
        "queue yes (priority 0, shared line, max_in_flight unlimited, max_queued 64 from queue_max)"
    )
    assert shared in out  # the template's defaults
    assert "affinity route; queue no;" in out
    # Each route's class and what batch may hold of a host; queue = false routes never queue.
    assert "; class standard; batch_slots what the turns leave;" in out
    assert "queue no; class standard;" in out


def test_check_prints_a_keys_class_and_max_class_where_set(tmp_path, capsys):
    text = EXAMPLE.read_text() + (
        '\n[keys.nightly]\nsecret = "sk-nightly-0123456789ab"\nroutes = ["convo"]\n'
        'class = "batch"\nmax_class = "batch"\n'
    )
    path = tmp_path / "classes.toml"
    path.write_text(text)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("nightly:"))
    assert "class batch; max_class batch" in line


def test_check_refuses_a_non_positive_weight_or_cap_with_its_dotted_path(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(
        BAD.replace('affinity = "sticky"', "weight = 0\nmax_in_flight = 0\npriority = 500")
    )
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "routes.convo.weight: must be larger than zero, not 0" in err
    assert "routes.convo.max_in_flight: must be at least 1, not 0" in err
    assert "routes.convo.priority: must be at most 100, not 500" in err


def test_check_prints_every_error_one_a_line_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:4] == [
        'server.lease_idle: "forever" is not a duration (use e.g. "250ms", "90s", "30m", "2h", "7d")',
        'hosts.titan.url: not an http(s) URL: "ftp://titan"',
        'routes.convo.affinity: must be "conversation" or "route"',
        'routes.convo.hosts: unknown host "tytan"',
    ]
    assert err[-1].endswith("4 error(s)")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"[server\nlisten=", "not valid TOML"),
        (b"\xff\xfe\x00garbage", "not UTF-8 text"),
    ],
)
def test_a_missing_or_unreadable_file_is_one_clear_line(tmp_path, content, message):
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [f"{path}: {message}"] or info.value.errors[0].startswith(
        f"{path}: {message}"
    )


def test_a_directory_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


@pytest.mark.parametrize("content", [None, "not = [toml", BAD])
def test_no_traceback_reaches_the_operator_from_check(tmp_path, content):
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_text(content)
    result = run("-m", "crossbar.cli", "check", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert str(path) in result.stderr or "routes.convo" in result.stderr


def test_twistd_refuses_a_bad_config_with_its_errors_and_no_traceback(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    twistd = str(pathlib.Path(sys.executable).parent / "twistd")
    result = subprocess.run(
        [twistd, "--nodaemon", "--pidfile=", "crossbar", "-c", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert 'routes.convo.hosts: unknown host "tytan"' in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


GOOD = """
[server]
db = "{db}"
[hosts.titan]
url = "http://127.0.0.1:1"
models = ["qwen-coder"]
"""


@pytest.mark.parametrize(
    ("make_db", "reason"),
    [
        (lambda d: d / "missing" / "c.db", "does not exist"),
        (
            lambda d: (d / "c.db").write_text("not sqlite at all " * 100) and d / "c.db",
            "not a SQLite database",
        ),
        (lambda d: d, "it is a directory"),
    ],
    ids=["missing-directory", "not-a-database", "a-directory"],
)
def test_twistd_refuses_a_store_it_cannot_use_in_one_line(tmp_path, make_db, reason):
    db = make_db(tmp_path)
    config = tmp_path / "c.toml"
    config.write_text(GOOD.format(db=db))
    twistd = str(pathlib.Path(sys.executable).parent / "twistd")
    result = subprocess.run(
        [twistd, "--nodaemon", "--pidfile=", "crossbar", "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"server.db: cannot open the store {db}: " in result.stderr
    assert reason in result.stderr
    # The reason, then the verdict, as the operator guide shows them.
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[1] == "crossbar: no store; not starting", lines
    assert "Traceback" not in result.stderr + result.stdout


def test_a_usable_store_file_is_created_and_migrated_by_the_start_check(tmp_path):
    from crossbar.store import database as store

    db = tmp_path / "c.db"
    assert store.check(str(db)) is None
    assert store.check(str(db)) is None  # and opened again without a change
    assert db.stat().st_size > 0


def test_check_shows_the_store_and_host_urls_without_their_passwords(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(
        '[server]\ndb = "postgresql://crossbar:hunter2@db.internal:5432/crossbar?sslmode=require"\n'
        '[hosts.a]\nurl = "http://llama:hunter2@127.0.0.1:9"\nmodels = ["m"]\n'
    )
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "db postgresql://crossbar:***@db.internal:5432/crossbar?sslmode=require;" in out
    assert "  a  http://llama:***@127.0.0.1:9" in out  # a host's URL hides its password too
    assert "hunter2" not in out


def test_a_reader_that_stops_early_gets_no_traceback():
    # `crossbar check config.toml | head -1`: the pipe closes before crossbar has written.
    crossbar = str(pathlib.Path(sys.executable).parent / "crossbar")
    process = subprocess.Popen(
        [crossbar, "check", str(EXAMPLE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()
    _, err = process.communicate(timeout=60)
    assert (process.returncode, err.decode()) == (0, "")
